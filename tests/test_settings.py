"""Configuration is read once from HVDLIKE_* variables; bad values name the variable."""
import pytest

from hvdlike.settings import Settings


def test_defaults():
    s = Settings.from_env({})
    assert (s.fusion_threshold, s.consistency_check, s.abort_on_exception, s.node_names) == (
        64 * 1024 * 1024, True, True, None)
    assert (s.shm_threshold, s.shm_buffer) == (256 * 1024, 64 * 1024 * 1024)


def test_values_are_parsed():
    s = Settings.from_env({"HVDLIKE_FUSION_THRESHOLD": "1024", "HVDLIKE_CONSISTENCY_CHECK": "0",
                           "HVDLIKE_ABORT_ON_EXCEPTION": "false", "HVDLIKE_NODE_NAMES": "a, a,b",
                           "HVDLIKE_SHM_THRESHOLD": "0", "HVDLIKE_SHM_BUFFER": "4096"})
    assert (s.fusion_threshold, s.consistency_check, s.abort_on_exception, s.node_names) == (
        1024, False, False, ("a", "a", "b"))
    assert (s.shm_threshold, s.shm_buffer) == (0, 4096)


@pytest.mark.parametrize("key,value,words", [
    ("HVDLIKE_FUSION_THRESHOLD", "64MB", "not an integer"),
    ("HVDLIKE_FUSION_THRESHOLD", "-1", "must be >= 0"),
    ("HVDLIKE_CONSISTENCY_CHECK", "maybe", "not a boolean"),
    ("HVDLIKE_SHM_BUFFER", "-5", "must be >= 0"),
    ("HVDLIKE_SHM_THRESHOLD", "1MiB", "not an integer"),
])
def test_bad_values_name_the_variable(key, value, words):
    with pytest.raises(ValueError, match=key) as info:
        Settings.from_env({key: value})
    assert words in str(info.value)
