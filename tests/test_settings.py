"""Configuration is read once from HVDLIKE_* variables; bad values name the variable."""
import dataclasses

import pytest

from hvdlike.base.settings import Settings


def test_defaults():
    s = Settings.from_env({})
    assert (s.fusion_threshold, s.abort_on_exception, s.node_names) == (
        64 * 1024 * 1024, True, None)
    assert (s.cycle_time_ms, s.cache_capacity) == (1.0, 1024)
    assert (s.shm_threshold, s.shm_buffer) == (256 * 1024, 64 * 1024 * 1024)
    assert (s.cma, s.cma_threshold) == ("1", 8 * 1024 * 1024)


def test_values_are_parsed():
    s = Settings.from_env({"HVDLIKE_FUSION_THRESHOLD": "1024", "HVDLIKE_CYCLE_TIME": "2.5",
                           "HVDLIKE_CACHE_CAPACITY": "64", "HVDLIKE_ABORT_ON_EXCEPTION": "false", "HVDLIKE_NODE_NAMES": "a, a,b",
                           "HVDLIKE_SHM_THRESHOLD": "0", "HVDLIKE_SHM_BUFFER": "4096",
                           "HVDLIKE_CMA": "0", "HVDLIKE_CMA_THRESHOLD": "65536"})
    assert (s.fusion_threshold, s.cycle_time_ms, s.cache_capacity, s.abort_on_exception,
            s.node_names) == (1024, 2.5, 64, False, ("a", "a", "b"))
    assert (s.shm_threshold, s.shm_buffer) == (0, 4096)
    assert (s.cma, s.cma_threshold) == ("0", 65536)
    assert Settings.from_env({"HVDLIKE_CMA": "AUTO"}).cma == "auto"
    assert Settings.from_env({"HVDLIKE_CMA": "yes"}).cma == "1"


def test_overlap_and_timeline_settings():
    assert (Settings().overlap, Settings().timeline, Settings().timeline_mark_cycles) == (
        True, None, False)
    s = Settings.from_env({"HVDLIKE_OVERLAP": "0", "HVDLIKE_TIMELINE": "/tmp/t.json",
                           "HVDLIKE_TIMELINE_MARK_CYCLES": "yes"})
    assert (s.overlap, s.timeline, s.timeline_mark_cycles) == (False, "/tmp/t.json", True)
    assert Settings().overlap_bucket == 1 << 20
    assert Settings.from_env({"HVDLIKE_OVERLAP_BUCKET": "0"}).overlap_bucket == 0


def test_stall_and_log_settings():
    s = Settings()
    assert (s.stall_check, s.stall_check_time, s.stall_shutdown_time, s.log_level) == (
        True, 60.0, 0.0, "warning")
    s = Settings.from_env({"HVDLIKE_STALL_CHECK_TIME_SECONDS": "2.5",
                           "HVDLIKE_STALL_SHUTDOWN_TIME_SECONDS": "10",
                           "HVDLIKE_STALL_CHECK_DISABLE": "1", "HVDLIKE_LOG_LEVEL": "DEBUG"})
    assert (s.stall_check, s.stall_check_time, s.stall_shutdown_time, s.log_level) == (
        False, 2.5, 10.0, "debug")


@pytest.mark.parametrize("key,value,words", [
    ("HVDLIKE_STALL_CHECK_TIME_SECONDS", "0", "more than 0 seconds"),
    ("HVDLIKE_STALL_CHECK_TIME_SECONDS", "1m", "not a number of seconds"),
    ("HVDLIKE_STALL_SHUTDOWN_TIME_SECONDS", "-1", ">= 0 (0: never) seconds"),
    ("HVDLIKE_STALL_CHECK_DISABLE", "perhaps", "not a boolean"),
    ("HVDLIKE_LOG_LEVEL", "loud", "not one of trace, debug, info, warning, error, fatal"),
    ("HVDLIKE_FUSION_THRESHOLD", "64MB", "not an integer"),
    ("HVDLIKE_FUSION_THRESHOLD", "-1", "must be >= 0"),
    ("HVDLIKE_ABORT_ON_EXCEPTION", "maybe", "not a boolean"),
    ("HVDLIKE_OVERLAP", "sometimes", "not a boolean"),
    ("HVDLIKE_OVERLAP_BUCKET", "1MiB", "not an integer"),
    ("HVDLIKE_OVERLAP_BUCKET", "-1", "must be >= 0"),
    ("HVDLIKE_CYCLE_TIME", "fast", "not a number of milliseconds"),
    ("HVDLIKE_CYCLE_TIME", "0", "more than 0"),
    ("HVDLIKE_SHM_BUFFER", "-5", "must be >= 0"),
    ("HVDLIKE_SHM_THRESHOLD", "1MiB", "not an integer"),
    ("HVDLIKE_CMA", "sometimes", "use 1, 0 or auto"),
    ("HVDLIKE_CMA_THRESHOLD", "-1", "must be >= 0"),
])
def test_bad_values_name_the_variable(key, value, words):
    with pytest.raises(ValueError, match=key) as info:
        Settings.from_env({key: value})
    assert words in str(info.value)


def test_horovod_names_set_what_hvdlike_names_leave_unset():
    s = Settings.from_env({"HOROVOD_FUSION_THRESHOLD": "1048576", "HOROVOD_CYCLE_TIME": "5",
                           "HOROVOD_TIMELINE": "/tmp/tl.json",
                           "HOROVOD_STALL_CHECK_TIME_SECONDS": "30",
                           "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "90",
                           "HOROVOD_LOG_LEVEL": "ERROR", "HOROVOD_CACHE_CAPACITY": "128"})
    assert (s.fusion_threshold, s.cycle_time_ms, s.timeline, s.stall_check_time,
            s.stall_shutdown_time, s.log_level, s.cache_capacity) == (
        1 << 20, 5.0, "/tmp/tl.json", 30.0, 90.0, "error", 128)
    assert Settings.from_env({"HOROVOD_STALL_CHECK_DISABLE": "1"}).stall_check is False


def test_the_hvdlike_name_wins_and_disagreement_and_ignored_settings_are_reported():
    from hvdlike.base.settings import with_horovod_names

    env = {"HVDLIKE_CYCLE_TIME": "2", "HOROVOD_CYCLE_TIME": "5",
           "HOROVOD_GPU_OPERATIONS": "NCCL"}
    assert Settings.from_env(env).cycle_time_ms == 2.0
    _, notes = with_horovod_names(env)
    assert notes == ["HVDLIKE_CYCLE_TIME='2' and HOROVOD_CYCLE_TIME='5' disagree; using "
                     "HVDLIKE_CYCLE_TIME",
                     "HOROVOD_GPU_OPERATIONS is ignored: hvdlike chooses NCCL for GPU arrays "
                     "where it can; set HVDLIKE_GPU_TRANSPORT=nccl or staged to choose"]
    assert with_horovod_names({"HOROVOD_CYCLE_TIME": "5", "HVDLIKE_CYCLE_TIME": "5"})[1] == []


def test_variables_that_are_no_setting_are_reported_once_with_what_to_do():
    """A typo in an HVDLIKE_ name, a setting that is gone, and Horovod variables that have no
    effect here are said; build-time Horovod variables and names hvdlike reads are not."""
    from hvdlike.base.settings import with_horovod_names

    env = {"HVDLIKE_FUSION_TRESHOLD": "1024", "HOROVOD_AUTOTUNE": "1",
           "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.8", "HOROVOD_CONTROLLER": "gloo",
           "HOROVOD_CPU_OPERATIONS": "mpi", "HOROVOD_ENABLE_XLA_OPS": "1",
           "HOROVOD_WITH_TENSORFLOW": "1", "HOROVOD_GPU_ALLREDUCE": "NCCL",
           "HVDLIKE_CYCLE_TIME": "2", "HVDLIKE_RESTART": "0", "HVDLIKE_TEST_CHECKS": "x"}
    notes = with_horovod_names(env)[1]
    assert [n.split(":")[0] for n in notes] == [
        "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE is ignored",
        "HOROVOD_CONTROLLER is ignored", "HOROVOD_ENABLE_XLA_OPS is ignored",
        "HVDLIKE_FUSION_TRESHOLD is not an hvdlike setting and has no effect"], notes
    assert notes[0] == ("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE is ignored: hvdlike's autotune "
                        "searches with optuna's TPE sampler, which has no noise term")
    assert notes[1] == "HOROVOD_CONTROLLER is ignored: hvdlike runs on MPI only"
    assert notes[2] == ("HOROVOD_ENABLE_XLA_OPS is ignored: hvdlike's collectives run between "
                        "XLA-compiled parts (Keras fit does that with jit_compile=True), "
                        "never inside them")
    assert with_horovod_names({"HOROVOD_DYNAMIC_PROCESS_SETS": "1", "HOROVOD_FOO": "1"})[1] == [
        "HOROVOD_DYNAMIC_PROCESS_SETS is ignored: process sets can always be added and removed "
        "after init", "HOROVOD_FOO is ignored: hvdlike has no such setting"]
    assert notes[3].endswith("did you mean HVDLIKE_FUSION_THRESHOLD?")
    env = {"HVDLIKE_CONSISTENCY_CHECK": "0", "HVDLIKE_NO_SUCH_THING": "1"}
    assert with_horovod_names(env)[1] == [
        "HVDLIKE_CONSISTENCY_CHECK is not an hvdlike setting and has no effect: the check that "
        "ranks agree is part of matching collectives by name and can no longer be turned off",
        "HVDLIKE_NO_SUCH_THING is not an hvdlike setting and has no effect: see the settings "
        "reference, docs/reference/settings.md"]


def test_every_hvdlike_variable_the_code_reads_is_known():
    """KNOWN_NAMES (what is not reported as a typo) lists every HVDLIKE_ name in hvdlike's
    code and scripts, and every setting of the reference."""
    import re
    from pathlib import Path
    from hvdlike.base import settings

    root = Path(__file__).resolve().parent.parent
    files = [*root.joinpath("hvdlike").rglob("*.py"), *root.joinpath("scripts").rglob("*.sh"),
             *root.joinpath("scripts").rglob("*.py")]
    used = {m for f in files for m in re.findall(r"HVDLIKE_[A-Z0-9_]+",
                                                 f.read_text(errors="replace"))
            if not m.endswith("_")}  # a prefix, such as HVDLIKE_TEST_
    used -= {"HVDLIKE_CONSISTENCY_CHECK"}  # named in settings.py as a setting that is gone
    missing = sorted(n for n in used if n not in settings.KNOWN_NAMES
                     and not n.startswith(settings._KNOWN_PREFIXES))
    assert missing == []
    assert {v.name for v in settings.VARIABLES} <= settings.KNOWN_NAMES


def test_the_settings_reference_lists_every_setting_with_its_real_default():
    """docs/reference/settings.md is ``reference_table()``, made from VARIABLES: every variable
    Settings reads is there, each default there is what an unset variable gives, and each
    Horovod name stands beside the variable it sets."""
    import inspect
    import re
    from hvdlike.base import settings

    names = [v.name for v in settings.VARIABLES]
    assert len(names) == len(set(names))
    parsed = set(re.findall(r'"(HVDLIKE_[A-Z0-9_]+)"', inspect.getsource(Settings._parse)))
    assert parsed and parsed <= set(names), sorted(parsed - set(names))
    for v in settings.VARIABLES:
        if v.name in parsed and v.default is not None:
            given = Settings.from_env({v.name: v.default})  # (a knob given is held by autotune)
            assert dataclasses.replace(given, autotune_pinned=()) == Settings.from_env({}), v
    table = settings.reference_table()
    for v in settings.VARIABLES:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{v.name}` |"))
        assert v.meaning in row and (v.default is None or f"`{v.default}`" in row)
    for theirs, ours in settings.HOROVOD_NAMES.items():
        assert f"| `{ours}` |" in table and f"`{theirs}`" in table


def test_a_bad_horovod_value_names_the_horovod_variable():
    with pytest.raises(ValueError, match="HOROVOD_FUSION_THRESHOLD='64MB' is not an integer"):
        Settings.from_env({"HOROVOD_FUSION_THRESHOLD": "64MB"})
    with pytest.raises(ValueError, match="HOROVOD_TIMELINE_MARK_CYCLES='x' is not a boolean"):
        Settings.from_env({"HOROVOD_TIMELINE_MARK_CYCLES": "x", "HOROVOD_TIMELINE": "t.json"})


def test_hierarchical_allgather_setting_and_its_horovod_name():
    assert Settings().hierarchical_allgather == "1"
    assert Settings.from_env({"HVDLIKE_HIERARCHICAL_ALLGATHER": "0"}).hierarchical_allgather == "0"
    assert Settings.from_env({"HOROVOD_HIERARCHICAL_ALLGATHER": "0"}).hierarchical_allgather == "0"
    with pytest.raises(ValueError, match="HVDLIKE_HIERARCHICAL_ALLGATHER='auto' is not one of"):
        Settings.from_env({"HVDLIKE_HIERARCHICAL_ALLGATHER": "auto"})


def test_hierarchical_allreduce_setting_and_its_horovod_name():
    assert Settings().hierarchical_allreduce == "auto"
    assert Settings.from_env({"HVDLIKE_HIERARCHICAL_ALLREDUCE": "0"}).hierarchical_allreduce == "0"
    assert Settings.from_env({"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}).hierarchical_allreduce == "1"
    with pytest.raises(ValueError, match="HVDLIKE_HIERARCHICAL_ALLREDUCE='yes' is not one of "
                                         "auto, 1, 0"):
        Settings.from_env({"HVDLIKE_HIERARCHICAL_ALLREDUCE": "yes"})
