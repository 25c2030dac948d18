"""A TCP proxy between one agent and the portal that a test can cut: the agent's network going away.

``cut()`` closes every open connection at once (both sides see the TCP connection end, as when a link dies)
and refuses new ones until ``restore()``. The proxy also reads the agent → portal WebSocket frames it forwards
(RFC 6455: masked client frames), so a test can see what crossed the wire after a reconnect — e.g. the
telemetry the agent buffered while cut off — without trusting either end's own account.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Frame:
    """One agent → portal text frame, parsed: when the proxy forwarded it and on which connection."""

    at: float
    connection: int
    data: dict = field(default_factory=dict)


class _FrameReader:
    """Incremental parser of the client → server direction of one WebSocket connection."""

    def __init__(self, connection: int, sink: list[Frame], lock: threading.Lock) -> None:
        self.connection = connection
        self.sink = sink
        self.lock = lock
        self.buffer = b""
        self.in_handshake = True
        self.fragments: list[bytes] = []

    def feed(self, data: bytes) -> None:
        self.buffer += data
        if self.in_handshake:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            self.buffer = self.buffer[end + 4 :]
            self.in_handshake = False
        while self._one_frame():
            pass

    def _one_frame(self) -> bool:
        buffer = self.buffer
        if len(buffer) < 2:
            return False
        first, second = buffer[0], buffer[1]
        if first & 0x70:
            raise ValueError("compressed or extended WebSocket frames are not expected between agent and portal")
        opcode, length, offset = first & 0x0F, second & 0x7F, 2
        if length == 126:
            if len(buffer) < 4:
                return False
            (length,) = struct.unpack("!H", buffer[2:4])
            offset = 4
        elif length == 127:
            if len(buffer) < 10:
                return False
            (length,) = struct.unpack("!Q", buffer[2:10])
            offset = 10
        mask = b""
        if second & 0x80:
            mask = buffer[offset : offset + 4]
            offset += 4
        if len(buffer) < offset + length:
            return False
        payload = buffer[offset : offset + length]
        self.buffer = buffer[offset + length :]
        if mask:
            payload = bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))
        if opcode in (0x0, 0x1):
            self.fragments.append(payload)
            if first & 0x80:
                text = b"".join(self.fragments)
                self.fragments = []
                with contextlib.suppress(ValueError), self.lock:
                    self.sink.append(Frame(at=time.time(), connection=self.connection, data=json.loads(text)))
        return True


class CuttableProxy:
    def __init__(self, upstream_port: int, *, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.frames: list[Frame] = []
        self.connections = 0
        self.refused = 0
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._down = False
        self._closed = False
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        """The link dies: every open connection ends now and new ones are refused until :meth:`restore`."""
        with self._lock:
            self._down = True
            sockets, self._open = self._open, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def restore(self) -> None:
        with self._lock:
            self._down = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self.listener.close()

    def frames_of(self, message_type: str) -> list[Frame]:
        with self._lock:
            return [frame for frame in self.frames if frame.data.get("type") == message_type]

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _address = self.listener.accept()
            except OSError:
                return
            with self._lock:
                down = self._down
            if down:
                self.refused += 1
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()  # the portal itself is down: the agent sees a failed connect, as without a proxy
                continue
            with self._lock:
                self.connections += 1
                number = self.connections
                self._open += [client, upstream]
            reader = _FrameReader(number, self.frames, self._lock)
            threading.Thread(target=self._pump, args=(client, upstream, reader), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, None), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, reader: _FrameReader | None) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                target.sendall(data)
                if reader is not None:
                    reader.feed(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
