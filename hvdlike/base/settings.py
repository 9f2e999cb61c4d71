"""All of hvdlike's configuration, read once from the environment into one object.

``VARIABLES`` lists every setting (name, default, meaning); the settings reference
(docs/reference/settings.md, ``reference_table``) is generated from it and ``HOROVOD_NAMES``.
"""
import dataclasses
import difflib
import os
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

from .env_values import (
    read_bool,
    read_bool_or_auto,
    read_bytes,
    read_choice,
    read_count,
    read_log_level,
    read_ms,
    read_seconds,
)


class Variable(NamedTuple):
    """One environment variable of the settings: its name, its default as written in the
    environment (None: unset), what it does."""

    name: str
    default: Optional[str]
    meaning: str


# The settings every rank reads (``Settings.from_env``), in the order of the reference
# (docs/reference/settings.md is generated from this list, with the Horovod names below).
VARIABLES = (
    Variable("HVDLIKE_FUSION_THRESHOLD", "67108864",
             "bytes per fusion buffer in grouped collectives (0 disables fusion)"),
    Variable("HVDLIKE_SHM_THRESHOLD", "262144",
             "blocking all-reduces of at least this many bytes, within one node, use the "
             "shared-memory transport"),
    Variable("HVDLIKE_SHM_BUFFER", "67108864",
             "bytes one round of that transport reduces (each rank maps about that much shared "
             "memory plus 1/size of it); larger all-reduces take several rounds; 0 disables the "
             "transport"),
    Variable("HVDLIKE_CMA", "1",
             "those on-node all-reduces of a set on one node that have at least "
             "HVDLIKE_CMA_THRESHOLD bytes read the peers' inputs and write their outputs "
             "directly (Linux cross-memory attach: one copy, no window) where every rank of the "
             "set may; 0 keeps them all on the shared-memory window; `auto` tries both on the "
             "first buckets of each size from the threshold on and keeps the faster (the "
             "crossover depends on the machine and the number of ranks)"),
    Variable("HVDLIKE_CMA_THRESHOLD", "8388608",
             "bytes from which on-node all-reduces go single-copy (below it the window is "
             "faster: the kernel pins every page it copies)"),
    Variable("HVDLIKE_HIERARCHICAL_ALLREDUCE", "auto",
             "all-reduce buckets of at least HVDLIKE_SHM_THRESHOLD bytes of the whole world on "
             "several nodes (the same number of ranks on each): `1` reduces inside each node "
             "through shared memory, across nodes among ranks of equal local rank, then shares "
             "inside the node; `0` runs one flat MPI_Allreduce; `auto` tries both on the first "
             "buckets of each size and keeps the faster"),
    Variable("HVDLIKE_HIERARCHICAL_ALLGATHER", "1",
             "all-gathers of the whole world on several nodes with the same number of ranks (at "
             "least 2) each, numbered node after node: `1` gathers each node's parts on its "
             "first rank, all-gathers the nodes' blocks across nodes and broadcasts inside each "
             "node (each node's data crosses the network once per other node); `0` runs one flat "
             "MPI_Allgatherv, which sends every rank's part once per remote rank when parts "
             "differ in size (equal parts always go through MPI_Allgather, which Open MPI "
             "already runs node by node)"),
    Variable("HVDLIKE_CYCLE_TIME", "1",
             "milliseconds between the engine's rounds while some rank waits for others (ten "
             "times that when all are idle)"),
    Variable("HVDLIKE_CACHE_CAPACITY", "1024",
             "requests (name + metadata) the engine remembers, so that a repeated one is "
             "negotiated with one bit; 0: none, every request is negotiated in full (as "
             "Horovod's 0)"),
    Variable("HVDLIKE_OVERLAP", "1",
             "in a compiled train step, gradients go to the engine while backprop still runs (0: "
             "all of them together after the backward pass)"),
    Variable("HVDLIKE_OVERLAP_BUCKET", "1048576",
             "with HVDLIKE_OVERLAP, gradients go in buckets of about this many bytes, last layer "
             "first, each as soon as backprop has computed its last one (a gradient this large "
             "goes alone; 0: each gradient alone)"),
    Variable("HVDLIKE_TF_WAIT_KERNEL", "1",
             "in a tf.compat.v1 graph, each collective waits in an asynchronous TensorFlow op "
             "that holds no thread (built with the C++ compiler on first use); 0: in a "
             "`tf.numpy_function` that holds an inter-op thread while it waits"),
    Variable("HVDLIKE_FULL_TRACEBACKS", "0",
             "1: an error about a collective's input (ranks that disagree, a bad value, a "
             "deadlock, hvdlike not initialized) keeps its whole traceback through hvdlike and "
             "the exception it was made from (to report a bug in hvdlike); 0: it is raised from "
             "the function you called"),
    Variable("HVDLIKE_AUTOTUNE", "0",
             "1: during the first all-reduces, try settings of the knobs not set in the "
             "environment (fusion threshold, cycle time, and where they apply the single-copy "
             "threshold and hierarchical all-gather), scored by bytes all-reduced per second; "
             "rank 0 decides, every rank applies each choice in the same engine round, and the "
             "best one is kept (needs optuna: `pip install hvdlike[autotune]`)"),
    Variable("HVDLIKE_AUTOTUNE_LOG", None,
             "rank 0 writes every autotune sample (the knobs, bytes, seconds, score) and the "
             "choice to this CSV file"),
    Variable("HVDLIKE_AUTOTUNE_WARMUP_SAMPLES", "3",
             "autotune samples at the starting settings, left out of the search"),
    Variable("HVDLIKE_AUTOTUNE_STEPS_PER_SAMPLE", "10",
             "training steps per autotune sample (a step: until the first all-reduce's name "
             "comes back; at most 1000 engine rounds with all-reduces)"),
    Variable("HVDLIKE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "20",
             "autotune samples of the search (after the warm-up ones); then the best is kept"),
    Variable("HVDLIKE_AUTOTUNE_START", None,
             "autotune's starting settings, as `knob=value,...` (knobs: fusion_threshold, "
             "cycle_time_ms, cma_threshold, hierarchical_allgather); unlike a knob's own "
             "variable, which holds it fixed, autotune may change them"),
    Variable("HVDLIKE_TIMELINE", None,
             "write the timeline (Chrome trace JSON): rank 0 to this path, rank r > 0 with "
             "`.rank<r>` before the extension"),
    Variable("HVDLIKE_TIMELINE_MARK_CYCLES", "0",
             "mark every engine round that ran something in the timeline (`CYCLE_START`)"),
    Variable("HVDLIKE_ABORT_ON_EXCEPTION", "1",
             "an uncaught exception on any rank aborts the whole job"),
    Variable("HVDLIKE_STALL_CHECK_TIME_SECONDS", "60",
             "a rank that has waited this long for a collective that other ranks have not "
             "submitted logs which ranks and which collective, once"),
    Variable("HVDLIKE_STALL_SHUTDOWN_TIME_SECONDS", "0",
             "after waiting this long every rank prints that report and exits with status 1 (0: "
             "never)"),
    Variable("HVDLIKE_STALL_CHECK_DISABLE", "0",
             "1 turns the stall inspector off"),
    Variable("HVDLIKE_COLLECTIVE_TIMEOUT_SECONDS", "600",
             "a collective (or an engine round) still inside MPI after this long ends the rank "
             "with a message naming it, so that the launcher ends the job: a lost host or a "
             "frozen one (0: never)"),
    Variable("HVDLIKE_DEADLOCK_SECONDS", "10",
             "when every rank of a process set has been blocked waiting this long, each for "
             "names only the others could submit, those ranks raise DeadlockError naming what "
             "each waits for (0: never)"),
    Variable("HVDLIKE_LOG_LEVEL", "warning",
             "trace, debug, info, warning, error or fatal: what the `hvdlike` logger prints (on "
             "stderr, prefixed with the rank)"),
    Variable("HVDLIKE_GPU_TRANSPORT", "auto",
             "GPU arrays: `auto` (NCCL where every rank of the set has it and its own GPU, else "
             "staged through host memory with one warning), `nccl` (an error where NCCL cannot "
             "serve), `staged`"),
    Variable("HVDLIKE_NODE_NAMES", None,
             "comma-separated node name per world rank, overriding MPI's topology"),
    Variable("HVDLIKE_STATE_DIR", None,
             "`hvdlike.elastic`: commits also write the state here, and `elastic.run` resumes "
             "from it (`hvdlikerun --state-dir`)"),
    Variable("HVDLIKE_ELASTIC_MIN_NP", "1",
             "`hvdlike.elastic`: stop when fewer ranks than this survive (`hvdlikerun --min-np`)"),
    Variable("HVDLIKE_ELASTIC_MAX_NP", "0",
             "`hvdlike.elastic`: start new ranks in place of dead ones, up to this many "
             "(`hvdlikerun --max-np`; 0: never)"),
    Variable("HVDLIKE_ELASTIC_RECOVERY_TIMEOUT", "120",
             "`hvdlike.elastic`: a rank still recovering from a death this many seconds after "
             "it began (MPI did not return) says where it is and exits with status 1, so the job "
             "ends instead of hanging (0: never)"),
)

# Horovod's names for the settings hvdlike has, so that a Horovod job script keeps its tuning.
# The HVDLIKE_ name wins where both are set.
HOROVOD_NAMES = {
    "HOROVOD_FUSION_THRESHOLD": "HVDLIKE_FUSION_THRESHOLD",
    "HOROVOD_CYCLE_TIME": "HVDLIKE_CYCLE_TIME",
    "HOROVOD_CACHE_CAPACITY": "HVDLIKE_CACHE_CAPACITY",
    "HOROVOD_TIMELINE": "HVDLIKE_TIMELINE",
    "HOROVOD_TIMELINE_MARK_CYCLES": "HVDLIKE_TIMELINE_MARK_CYCLES",
    "HOROVOD_STALL_CHECK_DISABLE": "HVDLIKE_STALL_CHECK_DISABLE",
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "HVDLIKE_STALL_CHECK_TIME_SECONDS",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "HVDLIKE_STALL_SHUTDOWN_TIME_SECONDS",
    "HOROVOD_LOG_LEVEL": "HVDLIKE_LOG_LEVEL",
    "HOROVOD_HIERARCHICAL_ALLREDUCE": "HVDLIKE_HIERARCHICAL_ALLREDUCE",
    "HOROVOD_HIERARCHICAL_ALLGATHER": "HVDLIKE_HIERARCHICAL_ALLGATHER",
    "HOROVOD_AUTOTUNE": "HVDLIKE_AUTOTUNE",
    "HOROVOD_AUTOTUNE_LOG": "HVDLIKE_AUTOTUNE_LOG",
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "HVDLIKE_AUTOTUNE_WARMUP_SAMPLES",
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "HVDLIKE_AUTOTUNE_STEPS_PER_SAMPLE",
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "HVDLIKE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
}
# The settings autotune may change (Settings fields) and the variable that holds each fixed.
TUNABLE = {
    "fusion_threshold": "HVDLIKE_FUSION_THRESHOLD",
    "cycle_time_ms": "HVDLIKE_CYCLE_TIME",
    "cma_threshold": "HVDLIKE_CMA_THRESHOLD",
    "hierarchical_allgather": "HVDLIKE_HIERARCHICAL_ALLGATHER",
}
# Horovod settings hvdlike has no equivalent for (yet), by name or prefix: said once per job,
# then ignored. Any other HOROVOD_ variable that is set gets a plain "no effect" note, except
# Horovod's build-time ones (_HOROVOD_BUILD), which mean nothing once Horovod is installed.
HOROVOD_IGNORED = {
    "HOROVOD_GPU_OPERATIONS": "hvdlike chooses NCCL for GPU arrays where it can; set "
                              "HVDLIKE_GPU_TRANSPORT=nccl or staged to choose",
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "hvdlike's autotune searches with optuna's "
                                               "TPE sampler, which has no noise term",
    "HOROVOD_CONTROLLER": "hvdlike runs on MPI only",
    "HOROVOD_CPU_OPERATIONS": "hvdlike runs on MPI only",
    "HOROVOD_DYNAMIC_PROCESS_SETS": "process sets can always be added and removed after init",
    "HOROVOD_ENABLE_XLA_OPS": "hvdlike's collectives run between XLA-compiled parts (Keras "
                              "fit does that with jit_compile=True), never inside them",
}
_HOROVOD_BUILD = ("HOROVOD_WITH_", "HOROVOD_WITHOUT_", "HOROVOD_BUILD_", "HOROVOD_GPU",
                  "HOROVOD_NCCL_", "HOROVOD_CUDA_", "HOROVOD_ROCM_", "HOROVOD_CMAKE",
                  "HOROVOD_MPICXX_SHOW", "HOROVOD_ALLOW_MIXED_GPU_IMPL", "HOROVOD_DEBUG")

# Every HVDLIKE_ variable hvdlike reads: the settings of VARIABLES, and those that
# hvdlike's own tools set for the ranks or read (tests/test_settings.py checks the list against
# the code). Any other one that is set is a typo or a setting that is gone: said once per job.
KNOWN_NAMES = frozenset({v.name for v in VARIABLES} | {
    # set by hvdlikerun, hvdlike.run and TF_CONFIG emulation for the ranks
    "HVDLIKE_RESTART", "HVDLIKE_RUN_ADDRESS", "HVDLIKE_RUN_AUTHKEY", "HVDLIKE_TF_BIND",
    "HVDLIKE_TF_CONFIG_HOST", "HVDLIKE_DEATH_WATCH",
    # set by hvdlikerun for its bind shim in the MPI's launcher
    "HVDLIKE_BIND_LOOPBACK",
    # read by hvdlikerun
    "HVDLIKE_TF_STARTUP_LOGS",
    # read by scripts/ (set-up, the test Slurm cluster, the GPU check)
    "HVDLIKE_VENV", "HVDLIKE_GPU_VENV", "HVDLIKE_SLURMCTLD_PORT", "HVDLIKE_SLURMD_PORT",
    "HVDLIKE_SLURM_NO_INSTALL",
})
_KNOWN_PREFIXES = ("HVDLIKE_TEST_",)  # the test suite's own variables
_GONE = {"HVDLIKE_CONSISTENCY_CHECK": "the check that ranks agree is part of matching "
                                      "collectives by name and can no longer be turned off"}


def with_horovod_names(env: Mapping[str, str]) -> Tuple[Dict[str, str], List[str]]:
    """``env`` with every HVDLIKE_ setting that is unset taken from its Horovod name, and what
    to tell the user once: names that disagree, Horovod settings that have no effect, and
    HVDLIKE_ variables that are no setting (a typo, or one that is gone)."""
    merged, notes = dict(env), []
    for horovod, ours in HOROVOD_NAMES.items():
        theirs = env.get(horovod)
        if theirs is None or theirs == "":
            continue
        mine = env.get(ours)
        if mine is None or mine == "":
            merged[ours] = theirs
        elif mine != theirs:
            notes.append(f"{ours}={mine!r} and {horovod}={theirs!r} disagree; using {ours}")
    for name in sorted(env):
        if env[name] == "" or name in HOROVOD_NAMES:
            continue
        if name.startswith("HOROVOD_") and env[name] != "0":  # 0: what Horovod does unset
            why = next((why for prefix, why in HOROVOD_IGNORED.items()
                        if name.startswith(prefix)), None)
            if why is None and name.startswith(_HOROVOD_BUILD):
                continue
            if not (name in ("HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS")
                    and env[name].lower() == "mpi"):
                notes.append(f"{name} is ignored: {why or 'hvdlike has no such setting'}")
        elif name.startswith("HVDLIKE_") and name not in KNOWN_NAMES and not name.startswith(
                _KNOWN_PREFIXES):
            close = difflib.get_close_matches(name, sorted(KNOWN_NAMES), n=1, cutoff=0.8)
            why = _GONE.get(name) or (f"did you mean {close[0]}?" if close else
                                      "see the settings reference, docs/reference/settings.md")
            notes.append(f"{name} is not an hvdlike setting and has no effect: {why}")
    return merged, notes


@dataclasses.dataclass(frozen=True)
class Settings:
    fusion_threshold: int = 64 * 1024 * 1024
    shm_threshold: int = 256 * 1024
    shm_buffer: int = 64 * 1024 * 1024
    cma: str = "1"
    cma_threshold: int = 8 * 1024 * 1024
    hierarchical_allreduce: str = "auto"
    hierarchical_allgather: str = "1"
    cycle_time_ms: float = 1.0
    cache_capacity: int = 1024
    overlap: bool = True
    overlap_bucket: int = 1024 * 1024
    tf_wait_kernel: bool = True
    timeline: Optional[str] = None
    timeline_mark_cycles: bool = False
    abort_on_exception: bool = True
    node_names: Optional[Tuple[str, ...]] = None
    stall_check: bool = True
    stall_check_time: float = 60.0
    stall_shutdown_time: float = 0.0
    collective_timeout: float = 600.0
    deadlock_seconds: float = 10.0
    log_level: str = "warning"
    gpu_transport: str = "auto"
    autotune: bool = False
    autotune_log: Optional[str] = None
    autotune_warmup_samples: int = 3
    autotune_steps_per_sample: int = 10
    autotune_max_samples: int = 20
    autotune_start: Tuple[Tuple[str, Any], ...] = ()  # (knob, value)
    autotune_pinned: Tuple[str, ...] = ()  # knobs whose variable is set, sorted

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "Settings":
        """Read the HVDLIKE_* variables (and Horovod's names for them, see HOROVOD_NAMES); a
        malformed value raises ValueError naming the variable it came from."""
        merged, _ = with_horovod_names(env)
        try:
            return cls._parse(merged)
        except ValueError as exc:
            for horovod, ours in HOROVOD_NAMES.items():
                if str(exc).startswith(f"{ours}=") and ours not in env and horovod in env:
                    raise ValueError(str(exc).replace(ours, horovod)) from None
            raise

    @classmethod
    def _parse(cls, env: Mapping[str, str]) -> "Settings":
        names = env.get("HVDLIKE_NODE_NAMES")
        return cls(
            fusion_threshold=read_bytes(env, "HVDLIKE_FUSION_THRESHOLD",
                                        cls.fusion_threshold),
            shm_threshold=read_bytes(env, "HVDLIKE_SHM_THRESHOLD", cls.shm_threshold),
            shm_buffer=read_bytes(env, "HVDLIKE_SHM_BUFFER", cls.shm_buffer),
            cma=read_bool_or_auto(env, "HVDLIKE_CMA", cls.cma),
            cma_threshold=read_bytes(env, "HVDLIKE_CMA_THRESHOLD", cls.cma_threshold),
            hierarchical_allreduce=read_choice(env, "HVDLIKE_HIERARCHICAL_ALLREDUCE",
                                               ("auto", "1", "0")),
            hierarchical_allgather=read_choice(env, "HVDLIKE_HIERARCHICAL_ALLGATHER",
                                               ("1", "0")),
            cycle_time_ms=read_ms(env, "HVDLIKE_CYCLE_TIME", cls.cycle_time_ms),
            cache_capacity=read_bytes(env, "HVDLIKE_CACHE_CAPACITY", cls.cache_capacity),
            overlap=read_bool(env, "HVDLIKE_OVERLAP", cls.overlap),
            overlap_bucket=read_bytes(env, "HVDLIKE_OVERLAP_BUCKET", cls.overlap_bucket),
            tf_wait_kernel=read_bool(env, "HVDLIKE_TF_WAIT_KERNEL", cls.tf_wait_kernel),
            timeline=env.get("HVDLIKE_TIMELINE") or None,
            timeline_mark_cycles=read_bool(env, "HVDLIKE_TIMELINE_MARK_CYCLES",
                                           cls.timeline_mark_cycles),
            abort_on_exception=read_bool(env, "HVDLIKE_ABORT_ON_EXCEPTION",
                                         cls.abort_on_exception),
            node_names=tuple(n.strip() for n in names.split(",")) if names else None,
            stall_check=not read_bool(env, "HVDLIKE_STALL_CHECK_DISABLE", False),
            stall_check_time=read_seconds(env, "HVDLIKE_STALL_CHECK_TIME_SECONDS",
                                          cls.stall_check_time, zero=False),
            stall_shutdown_time=read_seconds(env, "HVDLIKE_STALL_SHUTDOWN_TIME_SECONDS",
                                             cls.stall_shutdown_time, zero=True),
            collective_timeout=read_seconds(env, "HVDLIKE_COLLECTIVE_TIMEOUT_SECONDS",
                                            cls.collective_timeout, zero=True),
            deadlock_seconds=read_seconds(env, "HVDLIKE_DEADLOCK_SECONDS",
                                          cls.deadlock_seconds, zero=True),
            log_level=read_log_level(env),
            gpu_transport=read_choice(env, "HVDLIKE_GPU_TRANSPORT",
                                      ("auto", "nccl", "staged")),
            autotune=read_bool(env, "HVDLIKE_AUTOTUNE", cls.autotune),
            autotune_log=env.get("HVDLIKE_AUTOTUNE_LOG") or None,
            autotune_warmup_samples=read_count(env, "HVDLIKE_AUTOTUNE_WARMUP_SAMPLES",
                                               cls.autotune_warmup_samples, 0),
            autotune_steps_per_sample=read_count(env, "HVDLIKE_AUTOTUNE_STEPS_PER_SAMPLE",
                                                 cls.autotune_steps_per_sample, 1),
            autotune_max_samples=read_count(env, "HVDLIKE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
                                            cls.autotune_max_samples, 1),
            autotune_start=_autotune_start(env),
            autotune_pinned=tuple(sorted(k for k, var in TUNABLE.items() if env.get(var))),
        )


def _autotune_start(env: Mapping[str, str]) -> Tuple[Tuple[str, Any], ...]:
    """HVDLIKE_AUTOTUNE_START's ``knob=value`` pairs, each value read and checked as the
    knob's own variable is."""
    raw = env.get("HVDLIKE_AUTOTUNE_START") or ""
    pairs = []
    for item in filter(None, (part.strip() for part in raw.split(","))):
        knob, _, value = item.partition("=")
        knob, value = knob.strip(), value.strip()
        if knob not in TUNABLE or not value:
            raise ValueError(f"HVDLIKE_AUTOTUNE_START={raw!r}: {item!r} is not knob=value with "
                             f"a knob among {', '.join(TUNABLE)}")
        try:  # the knob's own variable's checks and type
            typed = getattr(Settings._parse({TUNABLE[knob]: value}), knob)
        except ValueError as exc:
            raise ValueError(f"HVDLIKE_AUTOTUNE_START={raw!r}: {exc}") from None
        pairs.append((knob, typed))
    return tuple(pairs)


def reference_table() -> str:
    """The settings as a Markdown table: variable, default, Horovod's name, meaning."""
    horovod = {ours: theirs for theirs, ours in HOROVOD_NAMES.items()}
    rows = ["| variable | default | Horovod's name | meaning |", "|---|---|---|---|"]
    for v in VARIABLES:
        default = "(unset)" if v.default is None else f"`{v.default}`"
        alias = f"`{horovod[v.name]}`" if v.name in horovod else ""
        rows.append(f"| `{v.name}` | {default} | {alias} | {v.meaning} |")
    return "\n".join(rows) + "\n"
