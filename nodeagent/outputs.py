"""Collect a replica's output dir when it ends, and upload it to the portal; nothing lost to a restart.

A job's spec may name an ``output_dir`` (relative to its working dir). When a replica of it ends (succeeded or
failed), :class:`OutputCollector` packs that directory into ``<job dir>/.gpupool/output.tar.gz`` — regular files and
directories only: a link the job left is skipped, never followed, as the agent reads as root — and uploads it to
``PUT /api/v1/agents/outputs/<job>/<replica>/`` with the node's credential, retrying with backoff. A marker file
(``output.pending``) says an upload is owed, so an agent restarted meanwhile uploads it on start. An output above
the portal's limit (``output_max_bytes`` of the start) is not packed; ``output.refused`` in the job dir says why.

Packing and uploading run on one background thread: the agent's loop (heartbeats, telemetry) never waits on them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from queue import Queue

log = logging.getLogger(__name__)

PACKED = ".gpupool/output.tar.gz"
PENDING = ".gpupool/output.pending"
REFUSED = "output.refused"
RETRY_DELAYS_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


def output_size(root: Path) -> int:
    """Bytes of the regular files under ``root``, links not followed."""
    total = 0
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in files:
            info = os.lstat(os.path.join(folder, name))
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
    return total


def pack(root: Path, target: Path) -> None:
    """``root``'s regular files and directories into the .tar.gz ``target`` (links and devices skipped)."""

    def keep(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if not (member.isfile() or member.isdir()):
            return None
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        return member

    temporary = target.with_name(target.name + ".tmp")
    with tarfile.open(temporary, "w:gz") as archive:
        archive.add(root, arcname=".", filter=keep)
    os.replace(temporary, target)


class OutputCollector:
    def __init__(self, *, server: str, credential: str, opener: Callable = urllib.request.urlopen) -> None:
        self.server = server.rstrip("/")
        self.credential = credential
        self.opener = opener
        self._queue: Queue[tuple[int, int, Path, Path, int]] = Queue()
        self._thread = threading.Thread(target=self._work, name="gpupool-outputs", daemon=True)
        self._thread.start()

    def collect(self, *, job_id: int, replica: int, job_dir: Path, output_dir: Path, max_bytes: int) -> None:
        """Owe the portal this replica's output (marked on disk first), then pack and upload it in the background."""
        marker = job_dir / PENDING
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"output_dir": str(output_dir), "max_bytes": max_bytes}))
        self._queue.put((job_id, replica, job_dir, output_dir, max_bytes))

    def resume(self, job_dirs: list[tuple[int, int, Path]]) -> int:
        """Upload what a previous agent owed (job dirs with a pending marker). Returns how many."""
        owed = 0
        for job_id, replica, job_dir in job_dirs:
            marker = job_dir / PENDING
            if marker.is_file():
                data = json.loads(marker.read_text())
                self._queue.put((job_id, replica, job_dir, Path(data["output_dir"]), int(data["max_bytes"])))
                owed += 1
        return owed

    def pending(self, job_dir: Path) -> bool:
        return (job_dir / PENDING).exists()

    def _work(self) -> None:
        while True:
            job_id, replica, job_dir, output_dir, max_bytes = self._queue.get()
            try:
                self._one(job_id, replica, job_dir, output_dir, max_bytes)
            except Exception:  # never let one output stop the others
                log.exception("outputs: job %s replica %s: collecting the output failed", job_id, replica)

    def _one(self, job_id: int, replica: int, job_dir: Path, output_dir: Path, max_bytes: int) -> None:
        marker, packed = job_dir / PENDING, job_dir / PACKED
        if not output_dir.is_dir() or output_dir.is_symlink():
            log.info("outputs: job %s replica %s left no output dir %s", job_id, replica, output_dir)
            marker.unlink(missing_ok=True)
            return
        size = output_size(output_dir)
        if max_bytes and size > max_bytes:
            (job_dir / REFUSED).write_text(f"the output dir holds {size} bytes, over the limit of {max_bytes}\n")
            log.warning("outputs: job %s replica %s: %d bytes, over the limit %d", job_id, replica, size, max_bytes)
            marker.unlink(missing_ok=True)
            return
        if not packed.exists():
            pack(output_dir, packed)
        for delay in (*RETRY_DELAYS_S, None):
            if self._upload(job_id, replica, packed):
                marker.unlink(missing_ok=True)
                packed.unlink(missing_ok=True)
                return
            if delay is None:
                break
            time.sleep(delay)
        log.error("outputs: job %s replica %s: upload failed; retried when the agent starts again", job_id, replica)

    def _upload(self, job_id: int, replica: int, packed: Path) -> bool:
        body = packed.read_bytes()
        request = urllib.request.Request(
            f"{self.server}/api/v1/agents/outputs/{job_id}/{replica}/",
            data=body,
            method="PUT",
            headers={
                "Authorization": f"Bearer {self.credential}",
                "Content-Type": "application/gzip",
                "X-Content-Sha256": hashlib.sha256(body).hexdigest(),
            },
        )
        try:
            with self.opener(request, timeout=60) as response:
                log.info(
                    "outputs: job %s replica %s: %d bytes stored (%s)", job_id, replica, len(body), response.status
                )
                return True
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500 and exc.code not in (408, 429):
                log.error("outputs: job %s replica %s refused: %s %s", job_id, replica, exc.code, exc.read()[:300])
                return True  # refused for good (not this node's job, too large): not owed any more
            log.warning("outputs: job %s replica %s: upload answered %s", job_id, replica, exc.code)
        except OSError as exc:
            log.warning("outputs: job %s replica %s: upload failed: %s", job_id, replica, exc)
        return False
