"""Smoke run of the embedded mode: start `gpupool demo`, wait for /healthz, log in over HTTP as a demo
user, read the API root with that session, then stop the demo with Ctrl-C (SIGINT) and check it exits
cleanly. Exits non-zero on any failure."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPUPOOL = ROOT / ".venv" / "bin" / "gpupool"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = Path(os.environ.get("GPUPOOL_DATA_DIR", "/tmp")) / "demo.log"
    log = open(log_path, "w+")
    demo = subprocess.Popen(
        [str(GPUPOOL), "demo", "--port", str(port)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        health = None
        while time.monotonic() < deadline:
            if demo.poll() is not None:
                raise SystemExit(f"demo exited early with {demo.returncode}")
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=5) as response:
                    health = json.load(response)
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(1)
        if health is None:
            raise SystemExit("demo did not answer /healthz in time")
        print("smoke: /healthz", json.dumps(health))
        assert health["status"] == "ok", health
        assert health["mode"] == "embedded", health

        output = Path(log_path).read_text()
        password = re.search(r"password for all: (\S+)\)", output).group(1)
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        login_page = opener.open(f"{base}/accounts/login/", timeout=10).read().decode()
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page).group(1)
        form = urllib.parse.urlencode(
            {"username": "admin", "password": password, "csrfmiddlewaretoken": csrf, "next": "/"}
        ).encode()
        request = urllib.request.Request(f"{base}/accounts/login/", data=form, headers={"Referer": base + "/"})
        home = opener.open(request, timeout=10)
        landed = home.geturl()
        assert landed.startswith(base + "/") and "/accounts/login/" not in landed, f"login failed: {landed}"
        assert "admin" in home.read().decode(), "the console page does not show the logged-in user"
        assert any(cookie.name == "sessionid" for cookie in jar), "no session cookie after login"
        api_request = urllib.request.Request(f"{base}/api/v1/", headers={"Accept": "application/json"})
        api_root = json.load(opener.open(api_request, timeout=10))
        assert api_root["user"] == "admin", api_root
        print("smoke: logged in as admin, API root answered:", json.dumps(api_root)[:200])
    finally:
        if demo.poll() is None:
            demo.send_signal(signal.SIGINT)
        try:
            demo.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            raise SystemExit("demo did not stop within 60 s of Ctrl-C") from None
        log.seek(0)
        output = log.read()
        print("smoke: demo output tail:\n" + "\n".join(output.splitlines()[-15:]))
    if demo.returncode != 0:
        raise SystemExit(f"demo exited with {demo.returncode} after Ctrl-C")
    if "gpupool stopped" not in output:
        raise SystemExit("demo did not report a clean stop")
    print("smoke: demo stopped cleanly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
