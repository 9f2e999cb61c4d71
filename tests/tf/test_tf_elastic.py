"""Elastic Keras ``fit`` (Keras 3 and tf_keras) under ``hvdlikerun --elastic -np 4``: a rank
killed in the middle of an epoch; the three survivors finish and match one process that used
the same ranks from the last commit on (tests/tf/workers/elastic_fit.py)."""
import re
import sys

import pytest

from mpi_harness import TESTS, launch

CHECKS = ["elastic_fit_finishes_on_the_survivors",
          "elastic_fit_weights_equal_across_survivors",
          "elastic_fit_equals_one_process_with_the_same_ranks_from_the_commit_on"]


@pytest.mark.parametrize("legacy,flags", [("0", ["--elastic"]), ("1", ["--elastic"]),
                                          ("0", ["--max-np", "4"])],
                         ids=["keras3", "tf_keras", "keras3-replaced"])
def test_elastic_fit_survives_a_killed_rank_and_matches_the_reference(legacy, flags):
    """With --max-np 4 a new rank replaces the dead one and the reference uses four ranks
    throughout."""
    worker = TESTS / "tf" / "workers" / "elastic_fit.py"
    job = launch(4, [*flags, sys.executable, str(worker)], timeout=240,
                 env={"TF_USE_LEGACY_KERAS": legacy})
    assert not job.timed_out, job.output[-5000:]
    assert job.returncode == 0, job.output[-5000:]
    assert len(re.findall(r"^KILLING rank=3$", job.output, re.M)) == 1
    replaced = "--max-np" in flags
    assert ("WARNING: elastic: ranks [3] of 4 died; 3 ranks go on, renumbered 0..2 in their "
            "old order" + (", and a new rank joined as rank 3" if replaced else "")
            ) in job.output
    for check in CHECKS:
        assert job.passed(check, 4 if replaced else 3), (check, job.output[-5000:])


@pytest.mark.parametrize("np_", [2, 4])
def test_an_exception_on_one_rank_in_fit_ends_the_job_naming_it(np_):
    import time
    job = launch(np_, [sys.executable, str(TESTS / "tf" / "workers" / "fit_exception.py")],
                 timeout=180)
    ended = time.time()
    assert not job.timed_out, job.output[-5000:]
    assert job.returncode != 0 and "FINISHED" not in job.output
    assert "RuntimeError: rank 1 fails in the middle of fit" in job.output
    assert f"hvdlike: rank 1 of {np_} raised an uncaught RuntimeError" in job.output
    raised = float(re.search(r"^RAISING at (\S+)$", job.output, re.M).group(1))
    assert ended - raised <= 10
