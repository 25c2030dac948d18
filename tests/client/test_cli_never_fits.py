"""``gpupool-cli submit`` of a job the pool can never run: the server's 400 (``job_never_fits``) is shown with the
field and the largest shape there is, and ``--json`` keeps the machine-readable ``limit`` (issue 33, item 2)."""

from __future__ import annotations

import json

from scheduler.models import Job


def test_a_job_no_node_can_hold_is_refused_with_the_largest_node_named(pool, run_cli):
    cards = pool.node.devices.count()
    ran = run_cli("submit", "--gpus", str(cards * 4), "--", "python", "train.py")
    assert ran.exit_code == 5, ran.stderr  # refused, like any bad spec
    assert "[job_never_fits]: resources.gpus: never fits: " in ran.stderr
    assert f"per-replica cards: {cards * 4} asked, the largest sim-80g node has {cards}" in ran.stderr
    assert not Job.objects.exists()

    as_json = run_cli("submit", "--gpus", str(cards * 4), "--json", "--", "python", "train.py")
    body = json.loads(as_json.stderr)
    assert body["code"] == "job_never_fits" and body["status"] == 400
    assert (body["limit"]["field"], body["limit"]["asked"], body["limit"]["largest"]) == (
        "resources.gpus",
        cards * 4,
        cards,
    )
    # The largest job there is still goes in.
    assert run_cli("submit", "--gpus", str(cards), "--", "python", "train.py").exit_code == 0
