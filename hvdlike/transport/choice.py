"""HVDLIKE_HIERARCHICAL_ALLREDUCE=auto: try flat and hierarchical all-reduce on the job's own
buckets, then keep the faster one, per size class. HVDLIKE_CMA=auto does the same between
single copy and the shared-memory window on one node.

Which one wins depends on the network and the node, not on anything a rank can read: on two
test hosts of 2 ranks each (scripts/bench_cluster.py) hierarchical took 1.3-1.75x the time
of flat MPI over a 1 Gbit/s link (its cross step, two 2-rank all-reduces sharing the link,
uses it less well than Open MPI's 4-rank one) and won by 1.3-2x on the unshaped link, where
memory copies dominate. Single copy against the window on one node: where single copy starts
to win moved with the machine and the number of ranks (docs/performance.md). So ``auto``
measures. For each power-of-two class of bucket bytes, after one untimed bucket of the first
algorithm (the first of a size touches new memory), the next ``2 * TRIALS``
buckets alternate between the two; then each rank's median time of each is reduced with MAX
over the set (a step waits for the slowest rank), and the faster algorithm is kept for that
class. Every rank runs the same buckets in the same order, so every rank reaches that
reduction at the same bucket and keeps the same choice.
"""
import statistics
from typing import Any, Dict, List, Set, Tuple

import numpy as np
from mpi4py import MPI

from ..base import log

TRIALS = 5


class AlgorithmChoice:
    """One of two algorithms (``names``: the first, the second), per size class of a set's
    all-reduce buckets (see module doc)."""

    def __init__(self, comm: Any, names: Tuple[str, str] = ("flat", "hierarchical")) -> None:
        self._comm = comm
        self.names = names
        self._times: Dict[int, Tuple[List[float], List[float]]] = {}
        self._warm: Set[int] = set()  # size classes whose untimed first bucket has run
        self.picked: Dict[int, bool] = {}  # size class -> the second algorithm?

    def second(self, nbytes: int) -> bool:
        """Whether to run a bucket of ``nbytes`` with the second algorithm (the same on every
        rank)."""
        size_class = nbytes.bit_length()
        if size_class in self.picked:
            return self.picked[size_class]
        if size_class not in self._warm:
            return False
        tried_first, tried_second = self._times.setdefault(size_class, ([], []))
        return len(tried_second) < len(tried_first)  # alternate, the first first

    def record(self, nbytes: int, second: bool, seconds: float) -> None:
        """The time a bucket took; decides (collectively) once both have had their trials."""
        size_class = nbytes.bit_length()
        if size_class in self.picked:
            return
        if size_class not in self._warm:
            self._warm.add(size_class)
            return
        times = self._times[size_class]
        times[1 if second else 0].append(seconds)
        if len(times[0]) == len(times[1]) == TRIALS:
            mine = np.array([statistics.median(times[0]), statistics.median(times[1])])
            slowest = np.empty_like(mine)
            self._comm.Allreduce(mine, slowest, MPI.MAX)
            self.picked[size_class] = bool(slowest[1] < slowest[0])
            low = 1 << (size_class - 1)
            first_name, second_name = self.names
            log.logger.info(
                "all-reduce buckets of %d-%d bytes: %s (%s %.3g ms, %s %.3g ms, slowest "
                "rank's median of %d)", low, 2 * low - 1,
                second_name if self.picked[size_class] else first_name,
                first_name, slowest[0] * 1e3, second_name, slowest[1] * 1e3, TRIALS)
