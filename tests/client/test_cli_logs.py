"""``gpupool-cli logs -f`` against a live server: a running job's output as it is written, until the job ends."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from scheduler import logs as job_logs
from tests.client.conftest import finish, place_and_start, submitted_id

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_logs_follow_prints_a_running_jobs_output_until_it_ends(pool, run_cli):
    job_id = submitted_id(run_cli("submit", "--gpus", "1", "--", "python", "train.py").stdout)
    place_and_start(job_id, pool.node)
    lines = [f"epoch {n} loss {1 / (n + 1):.3f}\n" for n in range(5)]

    def the_job_prints_then_ends() -> None:
        try:
            offset = 0
            for line in lines:
                time.sleep(0.15)
                job_logs.job_log_append(node_id=pool.node.pk, job_id=job_id, replica=0, offset=offset, text=line)
                offset += len(line.encode())
            finish(job_id, pool.node)
        finally:
            connection.close()  # this thread's own connection

    writer = threading.Thread(target=the_job_prints_then_ends)
    started = time.monotonic()
    writer.start()
    ran = run_cli("logs", "-f", str(job_id), "--interval", "0.1")
    writer.join()
    assert ran.exit_code == 0, ran.stderr
    assert ran.stdout == "".join(lines)
    assert time.monotonic() - started >= 0.7  # it waited for the output as it came
    assert run_cli("logs", str(job_id)).stdout == "".join(lines)  # and reads it back whole afterwards
