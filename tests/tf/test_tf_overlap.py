"""Overlap of gradient all-reduces with backprop in a compiled Keras step, read from the
timeline every rank writes (see workers/overlap_checks.py)."""
import pytest

from mpi_harness import run_script

CHECK = "gradients_overlap_backprop_as_the_timeline_shows"


@pytest.mark.parametrize("overlap,bucket", [("1", ""), ("1", "0"), ("0", "")],
                         ids=["overlap_on", "overlap_on_each_gradient_alone", "overlap_off"])
def test_gradients_reach_the_engine_while_backprop_runs_only_with_overlap(tmp_path, overlap,
                                                                           bucket):
    env = {"HVDLIKE_TIMELINE": str(tmp_path / "timeline.json"), "HVDLIKE_OVERLAP": overlap,
           "HVDLIKE_OVERLAP_BUCKET": bucket}
    job = run_script(2, "overlap_checks.py", timeout=180, env=env)
    assert job.passed(CHECK, 2), job.output[-6000:]
    assert job.returncode == 0, job.output[-6000:]


def test_gradient_buckets_close_at_the_byte_cap_in_order():
    from hvdlike.tensorflow.gradients import buckets
    sizes = [4, 64, 64, 1024, 64, 512]  # last layer first, as backprop produces them
    assert buckets(sizes, 1000) == [[0, 1, 2, 3], [4, 5]]
    assert buckets(sizes, 64) == [[0, 1], [2], [3], [4], [5]]
    assert buckets(sizes, 0) == [[i] for i in range(6)]
    assert buckets(sizes, 1 << 20) == [list(range(6))]
    # a shape unknown when the graph is built closes its bucket
    assert buckets([4, None, 4, 4], 1000) == [[0, 1], [2, 3]]
    assert buckets([], 1000) == []
