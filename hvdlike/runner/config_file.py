"""horovodrun's ``--config-file``: a YAML file of settings, read as the flags they stand for.

The file has horovodrun's sections (``params``, ``autotune``, ``timeline``, ``stall_check``,
``library_options``, ``logging``, and ``controller``); each key becomes the ``hvdlikerun`` flag
of the same meaning, so it is applied, noted or checked exactly as that flag is. A flag given
on the command line wins over the file, as in horovodrun. Keys horovodrun does not know are
noted and left out (horovodrun ignores them silently: a typo there changes nothing either).
"""
import difflib
from typing import Any, Dict, List, Optional, Tuple, Union

# key -> the flag it stands for, (flag when true, flag when false) for a yes/no key, or None
# for a key horovodrun knows that has no hvdlikerun flag (noted)
Flag = Union[None, str, Tuple[Optional[str], Optional[str]]]
SECTIONS: Dict[str, Dict[str, Flag]] = {
    "params": {
        "fusion_threshold_mb": "--fusion-threshold-mb",
        "cycle_time_ms": "--cycle-time-ms",
        "cache_capacity": "--cache-capacity",
        "hierarchical_allreduce": ("--hierarchical-allreduce", "--no-hierarchical-allreduce"),
        "hierarchical_allgather": ("--hierarchical-allgather", "--no-hierarchical-allgather"),
    },
    "autotune": {
        "enabled": ("--autotune", None),
        "log_file": "--autotune-log-file",
        "warmup_samples": "--autotune-warmup-samples",
        "steps_per_sample": "--autotune-steps-per-sample",
        "bayes_opt_max_samples": "--autotune-bayes-opt-max-samples",
        "gaussian_process_noise": "--autotune-gaussian-process-noise",
    },
    "timeline": {
        "filename": "--timeline-filename",
        "mark_cycles": ("--timeline-mark-cycles", "--no-timeline-mark-cycles"),
    },
    "stall_check": {
        "enabled": ("--stall-check", "--no-stall-check"),
        "warning_time_seconds": "--stall-check-warning-time-seconds",
        "shutdown_time_seconds": "--stall-check-shutdown-time-seconds",
    },
    "library_options": {
        "mpi_threads_disable": ("--mpi-threads-disable", "--no-mpi-threads-disable"),
        "num_nccl_streams": "--num-nccl-streams",
        "gloo_timeout_seconds": "--gloo-timeout-seconds",
        "ccl_bgt_affinity": None,
    },
    "logging": {
        "level": "--log-level",
        "with_timestamp": ("--log-with-timestamp", "--log-without-timestamp"),
    },
}
CONTROLLERS = {"mpi": "--mpi", "gloo": "--gloo"}
TEXT = {"timeline.filename", "autotune.log_file", "logging.level"}  # the others are numbers

# (flag, its value or None for a switch, the flags a command line overrides it with)
Setting = Tuple[str, Optional[str], Tuple[str, ...]]


def read(path: str) -> Tuple[List[Setting], List[str]]:
    """The flags the file at ``path`` stands for, in the file's order, and notes on the keys
    left out. ValueError saying what is wrong with the file otherwise."""
    try:
        import yaml
    except ImportError:
        raise ValueError("--config-file needs PyYAML: pip install pyyaml") from None
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except OSError as e:
        raise ValueError(f"--config-file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"--config-file {path} is not valid YAML: {e}") from None
    config = {} if config is None else config
    if not isinstance(config, dict):
        raise ValueError(f"--config-file {path}: expected sections such as 'params:' at the "
                         f"top, found a {type(config).__name__}")
    flags: List[Setting] = []
    notes: List[str] = []
    for section, body in config.items():
        if section == "controller":
            controller = CONTROLLERS.get(str(body).lower())
            if controller is None:
                raise ValueError(f"--config-file {path}: controller: {body!r} is not one of "
                                 f"{', '.join(CONTROLLERS)}")
            flags.append((controller, None, tuple(CONTROLLERS.values())))
            continue
        keys = SECTIONS.get(section)
        if keys is None:
            notes.append(_unknown(path, str(section), SECTIONS.keys()))
            continue
        if not isinstance(body, dict):
            raise ValueError(f"--config-file {path}: {section}: expected keys such as "
                             f"'{next(iter(keys))}:', found {body!r}")
        for key, value in body.items():
            if key not in keys:
                notes.append(_unknown(path, f"{section}.{key}", keys.keys()))
            elif keys[key] is None:
                notes.append(f"--config-file {path}: {section}.{key}: no effect in hvdlike")
            elif value is not None:
                flags += _flags(path, f"{section}.{key}", keys[key], value)
    return flags, notes


def _flags(path: str, key: str, flag: Flag, value: Any) -> List[Setting]:
    if isinstance(flag, str):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (isinstance(value, str) if key in TEXT else number):
            raise ValueError(f"--config-file {path}: {key}: expected "
                             f"{'a text' if key in TEXT else 'a number'}, found {value!r}")
        return [(flag, str(value), (flag,))]
    if not isinstance(value, bool):
        raise ValueError(f"--config-file {path}: {key}: expected true or false, found {value!r}")
    chosen = flag[0] if value else flag[1]
    both = tuple(f for f in flag if f)
    return [(chosen, None, both)] if chosen else []  # autotune: false is the default


def _unknown(path: str, key: str, known: Any) -> str:
    near = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(known), n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return f"--config-file {path}: {key} is no horovodrun setting{hint}; left out"
