"""The timeline: each rank's Chrome-trace file shows every request's phases and buckets."""
import pytest
from mpi_harness import run_mpi, run_script



def test_each_request_has_its_phases_and_bucket(tmp_path):
    path = str(tmp_path / "timeline.json")
    delay = 0.3
    results = run_mpi(2, "timeline_cases:phases", timeout=60,
                      env={"HVDLIKE_TIMELINE": path, "HVDLIKE_SHM_THRESHOLD": "100000"},
                      path=path, delay=delay)
    for rank, rows in enumerate(results):
        assert sorted(rows) == ["ada", "g0", "g1", "g2", "gather", "grp", "late"], rows
        for name, events in rows.items():  # Horovod's names: NEGOTIATE_ALLREDUCE, ...
            op = "ALLGATHER" if name == "gather" else "ALLREDUCE"
            assert [e[0] for e in events[:2]] == ["QUEUED", "NEGOTIATE_" + op], (rank, name)
        # the three async all-reduces went in one fused bucket through the MPI buffer
        for name in ("g0", "g1", "g2"):
            kinds = [e[0] for e in rows[name]]
            assert "MPI_ALLREDUCE" in kinds, kinds
            bucket = next(e[2] for e in rows[name] if e[0] == "MPI_ALLREDUCE")
            assert bucket["tensors"] == 3 and bucket["members"] == ["g0", "g1", "g2"], bucket
            assert bucket["bytes"] == 4 * 600
            assert "MEMCPY_IN_FUSION_BUFFER" in kinds and "MEMCPY_OUT_FUSION_BUFFER" in kinds
        assert "SHM_ALLREDUCE" in [e[0] for e in rows["grp"]]
        assert "MPI_ALLGATHER" in [e[0] for e in rows["gather"]]
        assert "ADASUM" in [e[0] for e in rows["ada"]]
    # the early rank waited for the late one, and its timeline says so
    # (announced in full the first time, by its cache bit the second), and names that rank
    waited = [e for e in results[0]["late"] if e[0] == "WAIT_FOR_RANKS"]
    assert len(waited) == 2, results[0]["late"]
    for e in waited:
        assert e[1] >= 0.8 * delay * 1e6 and e[2] == {"last_ranks": [1]}, waited


def test_rank_0_writes_the_path_given_and_every_file_is_current_while_running(tmp_path):
    path = str(tmp_path / "timeline.json")
    results = run_mpi(2, "timeline_cases:while_running", timeout=60, path=path,
                      env={"HOROVOD_TIMELINE": path, "HOROVOD_TIMELINE_MARK_CYCLES": "1"})
    assert [r["file"] for r in results] == [path, str(tmp_path / "timeline.rank1.json")]
    for r in results:
        assert not r["closed"] and r["rows"] == ["test_allreduce"], r
        assert {"QUEUED", "NEGOTIATE_ALLREDUCE", "CYCLE_START"} <= set(r["names"]), r
        assert any(n.endswith("_ALLREDUCE") and n != "NEGOTIATE_ALLREDUCE"
                   for n in r["names"]), r  # the transport's phase


def test_one_rank_copies_each_tensor_without_a_fusion_buffer(tmp_path):
    path = str(tmp_path / "t.json")
    (r,) = run_mpi(1, "timeline_cases:single_rank", timeout=60,
                   env={"HVDLIKE_TIMELINE": path}, path=path)
    assert r["out"] == [[2.0 * i for i in range(6)], [0.0, 2.0, 4.0], [[2.0, 2.0], [2.0, 2.0]]]
    assert r["dtypes"] == ["float32", "float16", "float32"]
    assert r["phases"].count("SINGLE_RANK_COPY") == 2, r["phases"]  # one per dtype's bucket
    assert not {"MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE", "SHM_ALLREDUCE"} & set(r["phases"])


def test_start_and_stop_timeline_bound_what_is_recorded(tmp_path):
    path = str(tmp_path / "t.json")
    for r in run_mpi(2, "timeline_cases:start_and_stop", timeout=60, path=path):
        assert r["rows"] == ["during"], r
        assert r["cycles"] >= 1
        assert "non-empty path" in r["error"]


def _summary_module():
    from hvdlike.runner import timeline_summary
    return timeline_summary


def test_summary_splits_each_steps_communication_at_the_last_submit():
    summary = _summary_module()
    meta = [{"name": "thread_name", "ph": "M", "tid": t, "args": {"name": n}}
            for t, n in ((1, "a"), (2, "b"), (3, "steps"))]
    x = [("STEP", 3, 0, 100), ("QUEUED", 1, 10, 1), ("MPI_ALLREDUCE", 1, 20, 30),
         ("QUEUED", 2, 60, 1), ("SHM_ALLREDUCE", 2, 40, 40)]  # 40..80 overlaps 20..50
    events = meta + [{"name": n, "ph": "X", "tid": t, "ts": ts, "dur": d} for n, t, ts, d in x]
    events += [{"name": "WAIT_FOR_RANKS", "ph": "X", "tid": t, "ts": 11, "dur": d,
                "args": {"last_ranks": last}} for t, d, last in ((1, 5, [1]), (2, 7, [1, 3]))]
    (step,) = summary.summarise(events)["steps"]
    # communication: union of 20..50 and 40..80 = 60 us; backprop done at the last submit (60)
    assert step["communication_s"] == 60e-6 and step["requests"] == 2
    assert (step["hidden_s"], step["exposed_s"]) == (40e-6, 20e-6)
    assert summary.summarise(events)["transport_per_tensor_s"] == {"b": 40e-6, "a": 30e-6}
    assert summary.summarise(events)["waited_for_rank_s"] == {"1": 12e-6, "3": 7e-6}


def test_the_installed_summary_command_reads_every_ranks_file(tmp_path):
    import json
    import os
    import subprocess
    import sys
    path = str(tmp_path / "timeline.json")
    run_mpi(2, "timeline_cases:phases", timeout=60, env={"HVDLIKE_TIMELINE": path},
            path=path, delay=0.0)
    command = os.path.join(os.path.dirname(sys.executable), "hvdlike-timeline")
    out = subprocess.run([command, path, "--no-plot"], text=True, capture_output=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    summary = json.loads((tmp_path / "timeline_summary.json").read_text())
    assert sorted(summary) == ["0", "1"]
    for s in summary.values():
        assert s["phases_s"]["QUEUED"] > 0 and s["transport_per_tensor_s"]["grp"] > 0
    merged = json.loads((tmp_path / "timeline_merged.json").read_text())
    assert {e["pid"] for e in merged} == {0, 1}


@pytest.mark.parametrize("variable, planted, rank, what", [
    ("HVDLIKE_TIMELINE", "t.rank1.json", 1, "timeline (HVDLIKE_TIMELINE)"),
    ("HVDLIKE_AUTOTUNE_LOG", "t.json", 0, "autotune log (HVDLIKE_AUTOTUNE_LOG)")])
def test_a_link_planted_in_a_shared_folder_is_refused_on_every_rank_not_written_through(
        tmp_path, variable, planted, rank, what):
    shared = tmp_path / "shared"  # like /tmp: anyone may create files in it
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "victim"
    victim.write_text("another file of this user's")
    (shared / planted).symlink_to(victim)  # where a rank will write
    job = run_script(2, "timeline_refused.py", timeout=60,
                     env={variable: str(shared / "t.json"), "HVDLIKE_AUTOTUNE": "1"})
    raised = job.lines("RAISED")
    assert sorted(line.split()[1] for line in raised) == ["rank=0", "rank=1"], job.output
    for line in raised:
        assert f"OSError: hvdlike.init: rank {rank} cannot write its {what}" in line, line
        assert "is a symbolic link" in line, line
    assert not job.lines("INITIALIZED") and not job.timed_out, job.output
    assert victim.read_text() == "another file of this user's"
