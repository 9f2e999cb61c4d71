"""Overlap of gradient all-reduces with backprop in a compiled Keras step, read from the
timeline every rank writes (see workers/overlap_checks.py)."""
import pytest

from mpi_harness import run_script

CHECK = "gradients_overlap_backprop_as_the_timeline_shows"


@pytest.mark.parametrize("overlap", ["1", "0"], ids=["overlap_on", "overlap_off"])
def test_gradients_reach_the_engine_while_backprop_runs_only_with_overlap(tmp_path, overlap):
    env = {"HVDLIKE_TIMELINE": str(tmp_path / "timeline.json"), "HVDLIKE_OVERLAP": overlap}
    job = run_script(2, "overlap_checks.py", timeout=180, env=env)
    assert job.passed(CHECK, 2), job.output[-6000:]
    assert job.returncode == 0, job.output[-6000:]
