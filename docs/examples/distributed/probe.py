"""Try to connect to HOST:PORT (the arguments) and say what happened: 'connected', 'refused' or 'timed out'."""

import socket
import sys

host, port = sys.argv[1], int(sys.argv[2])
try:
    with socket.create_connection((host, port), timeout=5):
        print(f"{host}:{port} connected", flush=True)
except ConnectionRefusedError:
    print(f"{host}:{port} refused", flush=True)
except OSError as exc:
    print(f"{host}:{port} {'timed out' if isinstance(exc, TimeoutError) else exc}", flush=True)
