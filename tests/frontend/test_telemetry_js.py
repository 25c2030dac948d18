"""The charts' script (frontend/static/frontend/telemetry.js) run by node: a job's share of a card it shares,
the heatmap's colour steps (the same as the server's), and the socket's frames read as samples."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from frontend.summaries import HeatCell
from tests.conftest import skip_or_fail

SCRIPT = Path(__file__).resolve().parents[2] / "frontend/static/frontend/telemetry.js"


def run_script(expression: str, tmp_path: Path):
    """The value of ``expression`` (JSON) with the module's exports in ``m``."""
    if shutil.which("node") is None:
        skip_or_fail("node is not installed (apt-get install nodejs)")
    module = tmp_path / "telemetry.mjs"  # node takes a .js file under no package.json as CommonJS
    module.write_text(SCRIPT.read_text())
    code = f"import({json.dumps(str(module))}).then((m) => console.log(JSON.stringify({expression})))"
    result = subprocess.run(["node", "--input-type=module", "-e", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_job_on_a_shared_card_is_drawn_with_its_estimated_part_its_allocation_and_the_rest(tmp_path):
    shares = run_script(
        "[m.jobShare({job_millis: 300, card_allocated_millis: 800}, 80),"
        " m.jobShare({job_millis: 300, card_allocated_millis: 300}, 50),"
        " m.jobShare({job_millis: 300, card_allocated_millis: 800}, null),"
        " m.jobShare({job_millis: 1000, card_allocated_millis: 1000}, 80), m.jobShare({}, 80)]",
        tmp_path,
    )
    # 0.3 of a card whose jobs hold 0.8 in all, busy 80 %: 30 % is the job's (3/8), 50 % the other jobs'.
    assert shares[0] == pytest.approx({"own": 30, "allocated": 30, "others": 50})
    # Alone on the card so far: all of its work is the job's.
    assert shares[1] == {"own": 50, "allocated": 30, "others": 0}
    assert shares[2] == {"own": None, "allocated": 30, "others": None}
    # A whole card (or a page without a job) is charted as the card.
    assert shares[3] is None and shares[4] is None


def test_the_heatmaps_live_colours_match_the_servers(tmp_path):
    readings = [0, 4.9, 5, 44.5, 45, 95, 100, 120, -3]
    live = run_script(f"{json.dumps(readings)}.map(m.heatClass).concat([m.heatClass(null)])", tmp_path)
    drawn = [HeatCell("u", 0, value, 0).level for value in readings] + [HeatCell("u", 0, None, 0).level]
    assert live == drawn
    assert drawn[:3] == ["h0", "h0", "h1"] and drawn[-4:] == ["h10", "h10", "h0", "hn"]


def test_a_snapshot_frame_is_read_as_samples_at_the_time_they_were_measured(tmp_path):
    frame = {
        "type": "telemetry",
        "nodes": [
            {
                "node": 1,
                "sent_at": None,
                "snapshot": True,
                "devices": {"GPU-a": {"utilization_pct": 42, "at": "2026-11-27T14:05:00+00:00"}},
            }
        ],
    }
    [sample] = run_script(f"m.extractSamples({json.dumps(frame)})", tmp_path)
    assert sample["uuid"] == "GPU-a" and sample["utilization_pct"] == 42
    assert sample["_t"] == 1795788300  # 2026-11-27 14:05 UTC, not the moment the page read it
