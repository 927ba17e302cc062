"""The step API's decisions are those recorded on main e627010, bit for bit (issue 37).

``tests/golden/record.py`` drives the controller over 32 steps per scenario (each preset, prompt
mode, allocator and selection, the update-time signal, partial consumption, failed and filtered
groups) and stores a digest of every field of every step. Each test here recomputes one scenario
and fails naming the first step and field that differ; a controller state saved on e627010
(``tests/golden/state_*.pkl``) must still load and continue the very same trace.
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))
import record  # noqa: E402

_TRACES = json.loads((GOLDEN / "traces.json").read_text())["scenarios"]


def test_every_scenario_is_recorded() -> None:
    assert sorted(_TRACES) == sorted(record.SCENARIOS)
    assert all(len(t["digests"]) == record.STEPS >= 30 for t in _TRACES.values())


@pytest.mark.parametrize("name", sorted(record.SCENARIOS))
def test_trace_is_identical(name: str) -> None:
    digests, values, _ = record.trace(name)
    diff = record.first_difference(name, _TRACES[name]["digests"], digests)
    assert diff is None, f"{diff}; readable values at that step: golden vs now in tests/golden/traces.json"
    assert values == _TRACES[name]["values"]


@pytest.mark.parametrize("name", record.CHECKPOINTED)
def test_state_saved_on_e627010_loads_and_continues(name: str) -> None:
    with open(GOLDEN / f"state_{name}.pkl", "rb") as f:
        saved = pickle.load(f)
    run = record.Run(name)
    run.load(saved)
    start = record.CHECKPOINT_STEP + 1
    digests, _, _ = record.trace(name, start=start, run=run)
    diff = record.first_difference(name, _TRACES[name]["digests"][start - 1:], digests, start=start)
    assert diff is None, diff


def test_first_difference_names_step_and_field() -> None:
    golden = [{"n": "a", "mult": "b"}, {"n": "c", "mult": "d"}]
    assert record.first_difference("x", golden, [{"n": "a", "mult": "b"}, {"n": "c", "mult": "e"}]) == (
        "x: step 2 field 'mult' differs (golden d, now e)"
    )
