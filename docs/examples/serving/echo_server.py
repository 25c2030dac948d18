"""A tiny model server stand-in: answers every GET with which replica answered, the path it was asked for, who the
serving proxy said the caller is, and whether any credential reached it (none should). On SIGTERM it notes the
time and keeps serving for 2 s (a graceful drain) before it exits; it notes the time of every request it serves.

    python3 echo_server.py          # listens on $PORT, the job's first named port
"""

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        print(f"served {time.time():.3f} {self.path}", flush=True)
        body = json.dumps(
            {
                "replica": int(os.environ["GPUPOOL_REPLICA"]),
                "path": self.path,
                "user": self.headers.get("X-Gpupool-User", ""),
                "credentials_seen": bool(self.headers.get("Authorization") or self.headers.get("Cookie")),
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args) -> None:
        pass


def drain_then_exit(_signum: int, _frame: object) -> None:
    print(f"term {time.time():.3f}", flush=True)
    threading.Timer(2.0, lambda: os._exit(0)).start()


signal.signal(signal.SIGTERM, drain_then_exit)
print(f"listening on {os.environ['PORT']}", file=sys.stderr, flush=True)
ThreadingHTTPServer(("", int(os.environ["PORT"])), Handler).serve_forever()
