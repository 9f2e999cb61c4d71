"""Autotune (``HVDLIKE_AUTOTUNE=1``, Horovod's ``HOROVOD_AUTOTUNE``): during the first
all-reduces, try settings of the engine's knobs and keep the best, scored as Horovod scores
them, by bytes all-reduced per second.

A sample is ``autotune_steps_per_sample`` training steps, a step recognized by the first
all-reduce's name coming back; every rank sees the same responses in the same rounds, so
every rank ends a sample in the same round. There rank 0 scores it, asks the
search for the next settings and broadcasts them over the engine's own communicator (in the
engine thread, so no other thread is in MPI), and every rank applies them before its next
round. The first ``autotune_warmup_samples`` samples run the starting settings and are not
scored; then ``autotune_max_samples`` samples search (optuna's TPE sampler, seeded; the
starting and the default settings are its first two trials); then the best scored settings
are applied for the rest of the job. A knob whose own variable is set is left alone, as in
Horovod. Rank 0 writes every sample and the choice to ``autotune_log`` (CSV).
"""
import csv
import dataclasses
import importlib.util
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, cast

import numpy as np

from ..base import files
from ..base.log import logger
from ..base.settings import Settings
from .checks import Kind

_ALLREDUCES = (Kind.ALLREDUCE, Kind.GROUPED_ALLREDUCE)
_KiB, _MiB = 1024, 1024 * 1024
_ROUNDS_PER_STEP_AT_MOST = 1000  # a sample's end when no step is recognized


@dataclasses.dataclass(frozen=True)
class Knob:
    """A setting autotune may change: a ``Settings`` field, searched log-uniformly between
    ``low`` and ``high`` (whole numbers when ``whole``) or among ``choices``."""

    name: str
    low: float = 0.0
    high: float = 0.0
    whole: bool = False
    choices: Tuple[str, ...] = ()

    def distribution(self) -> Any:
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
        if self.choices:
            return CategoricalDistribution(list(self.choices))
        if self.whole:
            return IntDistribution(int(self.low), int(self.high), log=True)
        return FloatDistribution(self.low, self.high, log=True)

    def clip(self, value: Any) -> Any:
        """A setting's value as a point of the search (clipped into the range)."""
        if self.choices:
            return value if value in self.choices else self.choices[0]
        value = min(max(value, self.low), self.high)
        return int(value) if self.whole else float(value)


FUSION = Knob("fusion_threshold", 64 * _KiB, 256 * _MiB, whole=True)
CYCLE = Knob("cycle_time_ms", 0.1, 25.0)
SINGLE_COPY = Knob("cma_threshold", 256 * _KiB, 64 * _MiB, whole=True)
HIERARCHICAL_ALLGATHER = Knob("hierarchical_allgather", choices=("1", "0"))


def knobs_for(settings: Settings, single_copy: bool, node_blocks: bool) -> List[Knob]:
    """The knobs to tune: those that apply to this job (the single-copy threshold where the
    world's set has that transport, hierarchical all-gather on several nodes in blocks) and
    whose variable is not set."""
    knobs = [FUSION, CYCLE] + ([SINGLE_COPY] if single_copy else []) + (
        [HIERARCHICAL_ALLGATHER] if node_blocks else [])
    return [k for k in knobs if k.name not in settings.autotune_pinned]


def start(st: Any, world_set: Any, bcast: Callable[[object, int], object],
          apply: Callable[[Dict[str, Any]], None]) -> Optional["Autotuner"]:
    """The job's autotuner (None without HVDLIKE_AUTOTUNE, or with every knob held fixed).
    ``st``: the engine's world; ``world_set``: the global process set."""
    settings = st.settings
    if not settings.autotune:
        return None
    if importlib.util.find_spec("optuna") is None:
        raise ImportError("HVDLIKE_AUTOTUNE=1 needs optuna, which is not installed: pip install "
                          "'hvdlike[autotune]' (or optuna), or unset HVDLIKE_AUTOTUNE")
    group = getattr(world_set, "group", None)
    single_copy = group is not None and "cma" in group.reducers
    knobs = knobs_for(settings, single_copy, st.nodes_in_blocks)
    if not knobs:
        if st.rank == 0:
            logger.warning("HVDLIKE_AUTOTUNE=1 has nothing to tune: every knob's variable is "
                           "set (%s)", ", ".join(sorted(settings.autotune_pinned)))
        return None
    return Autotuner(settings, st.rank, knobs, bcast, apply)


def allreduced_bytes(requests: Sequence[Any]) -> int:
    """The bytes of all-reduce ``requests`` (single or grouped)."""
    total = 0
    for request in requests:
        if request.kind == Kind.GROUPED_ALLREDUCE:
            pairs = list(zip(request.dtype, request.shape))
        else:
            pairs = [(request.dtype, request.shape)]
        total += sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for dtype, shape in pairs)
    return total


class _Search:
    """Rank 0's search: optuna's TPE sampler over the knobs, asked and told one sample at
    a time (optuna chosen for its ask-and-tell interface and its handling of numbers on a
    log scale and choices together, with no server or storage)."""

    def __init__(self, knobs: List[Knob], first: List[Dict[str, Any]], samples: int) -> None:
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(seed=0, n_startup_trials=max(2, samples // 4))
        self._study = optuna.create_study(direction="maximize", sampler=sampler)
        for params in first:
            self._study.enqueue_trial(params, skip_if_exists=True)
        self._space = {k.name: k.distribution() for k in knobs}
        self._trial: Any = None

    def ask(self) -> Dict[str, Any]:
        self._trial = self._study.ask(self._space)
        return dict(self._trial.params)

    def tell(self, score: float) -> None:
        self._study.tell(self._trial, score)

    def best(self) -> Tuple[Dict[str, Any], float]:
        return dict(self._study.best_params), float(self._study.best_value)


class Autotuner:
    """Counts a job's training steps into samples and changes the knobs between them
    (``after_round``, after each round that ran something, on every rank). ``bcast(obj,
    root)`` is the engine's broadcast; ``apply(values)`` sets the knobs (a dict of Settings
    fields) on this rank."""

    def __init__(self, settings: Settings, rank: int, knobs: List[Knob],
                 bcast: Callable[[object, int], object],
                 apply: Callable[[Dict[str, Any]], None]) -> None:
        self._rank, self._knobs, self._bcast, self._apply = rank, knobs, bcast, apply
        self._steps = settings.autotune_steps_per_sample
        self._warmup = settings.autotune_warmup_samples
        self._samples = settings.autotune_max_samples
        self._log_path = settings.autotune_log if rank == 0 else None
        start = {k.name: k.clip(getattr(settings, k.name)) for k in knobs}
        start.update({n: k.clip(v) for n, v in settings.autotune_start
                      for k in knobs if k.name == n})
        defaults = {k.name: k.clip(getattr(Settings, k.name)) for k in knobs}
        self._current = dict(start)
        self._search = _Search(knobs, [start, defaults], self._samples) if rank == 0 else None
        if self._search is not None and self._warmup == 0:
            self._search.ask()  # the first trial: the starting settings (enqueued first)
        self._sample = 0  # samples ended so far
        self._anchor: Any = None  # the key of the first all-reduce seen: a step's mark
        self._marks = 0  # times the anchor came back in this sample: steps
        self._rounds = 0  # all-reduce rounds in this sample
        self._bytes = 0
        self._started = 0.0
        self.done = False
        self.applied: List[Tuple[int, Dict[str, Any]]] = []  # (sample, values) on this rank
        self._rows: List[List[Any]] = []
        self._set(start)

    def after_round(self, responses: Sequence[Any]) -> None:
        """Count a round; at the end of a sample, every rank takes rank 0's next settings.
        A training step is recognized by the first all-reduce the tuner saw coming back (its
        name recurs once a step); a sample ends after ``steps`` of them, or after ``1000 *
        steps`` rounds with all-reduces if the name never recurs."""
        if self.done:
            return
        counted = [r for r in responses if r.error is None and r.request.kind in _ALLREDUCES]
        if not counted:
            return
        now = time.perf_counter()
        if self._anchor is None:  # samples run from the end of this round
            self._anchor, self._started = counted[0].key, now
            return
        self._rounds += 1
        if self._rank == 0:  # only rank 0 scores
            self._bytes += allreduced_bytes([r.request for r in counted])
        self._marks += sum(r.key == self._anchor for r in counted)
        if self._marks < self._steps and self._rounds < _ROUNDS_PER_STEP_AT_MOST * self._steps:
            return
        seconds = now - self._started
        decision = self._decide(self._bytes / seconds, seconds) if self._rank == 0 else None
        values, done = cast(Tuple[Dict[str, Any], bool], self._bcast(decision, 0))
        self._sample += 1
        self._rounds, self._bytes, self._marks, self.done = 0, 0, 0, bool(done)
        self._set(values)
        self._started = time.perf_counter()

    def _decide(self, score: float, seconds: float) -> Tuple[Dict[str, Any], bool]:
        """Rank 0: log the sample that ended, and what runs next (and whether it is final)."""
        assert self._search is not None
        searching = self._sample >= self._warmup
        self._row("search" if searching else "warmup", self._current, self._bytes, seconds,
                  score)
        if searching:
            self._search.tell(score)
        if self._sample + 1 < self._warmup + self._samples:
            return (self._current if self._sample + 1 < self._warmup else self._search.ask(),
                    False)
        best, value = self._search.best()
        self._row("chosen", best, "", "", value)
        logger.info("autotune chose %s (%.3g bytes/s)", best, value)
        return best, True

    def _set(self, values: Dict[str, Any]) -> None:
        self._current = dict(values)
        self.applied.append((self._sample, dict(values)))
        self._apply(values)

    def _row(self, phase: str, values: Dict[str, Any], nbytes: Any, seconds: Any,
             score: float) -> None:
        self._rows.append([self._sample, phase] + [values[k.name] for k in self._knobs]
                          + [nbytes, seconds if seconds == "" else f"{seconds:.6f}",
                             f"{score:.6g}"])
        self._write_log()

    def _write_log(self) -> None:
        if self._log_path is None:
            return
        with files.open_for_writing(self._log_path, newline="") as f:
            out = csv.writer(f)
            out.writerow(["sample", "phase"] + [k.name for k in self._knobs]
                         + ["bytes", "seconds", "bytes_per_second"])
            out.writerows(self._rows)
