"""Autotune (HVDLIKE_AUTOTUNE=1): rank 0's choices applied alike on every rank, the log,
knobs held fixed by their variables, and bad settings."""
import csv
import importlib.util

import pytest

from hvdlike.base.settings import Settings
from hvdlike.engine import autotune
from mpi_harness import env_for, run_mpi

pytest.importorskip("optuna", reason="autotune needs optuna (pip install hvdlike[autotune])")

WARMUP, SAMPLES, STEPS = 2, 6, 4


@pytest.mark.parametrize("np_", [2, 4])
def test_every_rank_applies_rank_0s_choices_in_the_same_sample(np_, tmp_path):
    log = tmp_path / "autotune.csv"
    results = run_mpi(np_, "autotune_cases:tune", timeout=120, steps=40, env=env_for(
        HVDLIKE_AUTOTUNE=1, HVDLIKE_AUTOTUNE_LOG=log, HVDLIKE_AUTOTUNE_WARMUP_SAMPLES=WARMUP,
        HVDLIKE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=SAMPLES, HVDLIKE_AUTOTUNE_STEPS_PER_SAMPLE=STEPS,
        HVDLIKE_AUTOTUNE_START="fusion_threshold=65536", HVDLIKE_CYCLE_TIME=2))
    first = results[0]
    for r, res in enumerate(results):
        assert res["applied"] == first["applied"], f"rank {r} applied other settings or later"
        assert res["final"] == first["final"] and res["done"], f"rank {r}"
    # one setting per sample: the start, then one per sample that ended; the last is the final
    assert [sample for sample, _ in first["applied"]] == list(range(WARMUP + SAMPLES + 1))
    assert first["applied"][0][1]["fusion_threshold"] == 65536  # HVDLIKE_AUTOTUNE_START
    chosen = first["applied"][-1][1]
    assert chosen["fusion_threshold"] == first["final"]["fusion_threshold"]
    # the cycle time is held by HVDLIKE_CYCLE_TIME: never tuned, never logged
    assert all("cycle_time_ms" not in values for _, values in first["applied"])
    assert first["final"]["cycle_time_ms"] == 2.0
    rows = list(csv.DictReader(log.open()))
    assert [row["phase"] for row in rows] == (["warmup"] * WARMUP + ["search"] * SAMPLES
                                              + ["chosen"])
    assert "cycle_time_ms" not in rows[0]
    searched = rows[WARMUP:-1]
    assert all(int(row["bytes"]) > 0 and float(row["bytes_per_second"]) > 0 for row in searched)
    best = max(searched, key=lambda row: float(row["bytes_per_second"]))
    assert rows[-1]["fusion_threshold"] == best["fusion_threshold"]
    assert int(rows[-1]["fusion_threshold"]) == chosen["fusion_threshold"]
    # the first trials: the start, then the defaults
    assert int(searched[0]["fusion_threshold"]) == 65536
    assert int(searched[1]["fusion_threshold"]) == Settings.fusion_threshold


def test_without_a_recurring_name_a_sample_ends_after_1000_rounds_a_step(tmp_path):
    log = tmp_path / "autotune.csv"
    results = run_mpi(2, "autotune_cases:tune", timeout=180, steps=1200, unique=True,
                      env=env_for(HVDLIKE_AUTOTUNE=1, HVDLIKE_AUTOTUNE_LOG=log,
                                  HVDLIKE_AUTOTUNE_WARMUP_SAMPLES=0,
                                  HVDLIKE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=2,
                                  HVDLIKE_AUTOTUNE_STEPS_PER_SAMPLE=1))
    assert results[0]["done"] and results[0]["applied"] == results[1]["applied"]
    assert [row["phase"] for row in csv.DictReader(log.open())] == ["search"] * 2 + ["chosen"]


@pytest.mark.parametrize("env,says", [
    ({"HVDLIKE_AUTOTUNE_START": "fusion=1"}, "'fusion=1' is not knob=value with a knob among"),
    ({"HVDLIKE_AUTOTUNE_START": "cycle_time_ms=0"},
     "HVDLIKE_AUTOTUNE_START='cycle_time_ms=0': HVDLIKE_CYCLE_TIME='0' must be more than 0"),
    ({"HVDLIKE_AUTOTUNE_STEPS_PER_SAMPLE": "0"}, "must be at least 1"),
    ({"HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "few"},
     "HOROVOD_AUTOTUNE_WARMUP_SAMPLES='few' is not a whole number"),
])
def test_bad_autotune_settings_say_what_is_wrong(env, says):
    with pytest.raises(ValueError) as info:
        Settings.from_env(env)
    assert says in str(info.value)


def test_horovods_names_turn_it_on_and_a_set_knob_is_held_fixed():
    s = Settings.from_env({"HOROVOD_AUTOTUNE": "1", "HOROVOD_FUSION_THRESHOLD": "1048576"})
    assert s.autotune and s.autotune_pinned == ("fusion_threshold",)
    knobs = autotune.knobs_for(s, single_copy=True, node_blocks=True)
    assert [k.name for k in knobs] == ["cycle_time_ms", "cma_threshold", "hierarchical_allgather"]
    assert [k.name for k in autotune.knobs_for(s, False, False)] == ["cycle_time_ms"]


def test_without_optuna_autotune_says_how_to_install_it(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "optuna" else find_spec(name, *a))

    class World:
        settings = Settings.from_env({"HVDLIKE_AUTOTUNE": "1"})
        rank, nodes_in_blocks = 0, False

    with pytest.raises(ImportError, match=r"needs optuna.*pip install 'hvdlike\[autotune\]'"):
        autotune.start(World(), None, lambda obj, root: obj, lambda values: None)
