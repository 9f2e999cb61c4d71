"""An in-process stand-in for the collectives of the engine's rounds: P simulated ranks in
*classes* (ranges of ranks that behave alike), one thread per class, each with the real
``Negotiation`` of its lowest rank. Used by scripts/bench_control_plane.py and by
tests/test_negotiation.py."""
import pickle
import threading
import time
from typing import Any, Callable, List, Sequence

import numpy as np


class World:
    """``size`` simulated ranks in classes (ranges of ranks that behave alike), one thread
    per class; what the collectives exchange passes through here."""

    def __init__(self, size: int, classes: Sequence[range]) -> None:
        self.size, self.classes = size, list(classes)
        self._barrier = threading.Barrier(len(self.classes))
        self._values: List[Any] = [None] * len(self.classes)
        self._owner = np.empty(size, np.int64)  # rank -> its class
        for i, ranks in enumerate(self.classes):
            self._owner[ranks.start:ranks.stop] = i

    def exchange(self, index: int, value: Any) -> List[Any]:
        self._values[index] = value
        self._barrier.wait()
        got = list(self._values)
        self._barrier.wait()
        return got

    def class_of(self, rank: int) -> int:
        return int(self._owner[rank])


class SimNet:
    """One class's view of the collectives (``transport.interface.RoundNet``, plus the round's
    AND). ``excluded``: the thread's CPU inside the stand-in, left out of the rank's figures;
    ``bytes``: what the rank handed to collectives (sent + received)."""

    def __init__(self, world: World, index: int) -> None:
        self.world, self.index = world, index
        self.excluded = 0.0
        self.bytes = 0

    def _exchange(self, value: Any) -> List[Any]:
        start = time.thread_time()
        got = self.world.exchange(self.index, value)
        self.excluded += time.thread_time() - start
        return got

    def band(self, vector: np.ndarray) -> np.ndarray:
        values = self._exchange(vector.copy())
        start = time.thread_time()
        out = np.bitwise_and.reduce(np.stack(values))
        self.excluded += time.thread_time() - start
        self.bytes += 2 * vector.nbytes
        return out

    def min(self, value: int) -> int:
        self.bytes += 16
        return min(self._exchange(value))

    def bcast(self, obj: object, root: int) -> object:
        mine = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL) if obj is not None else None
        data = self._exchange(mine)[self.world.class_of(root)]
        self.bytes += len(data)
        return obj if mine is not None else pickle.loads(data)

    def allgather(self, obj: object) -> List[object]:
        mine = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        blobs = self._exchange(mine)
        self.bytes += len(mine) + sum(len(blobs[self.world.class_of(r)])
                                      for r in range(self.world.size))
        return [pickle.loads(blobs[self.world.class_of(r)]) for r in range(self.world.size)]

    def allgather_rows(self, row: np.ndarray) -> np.ndarray:
        rows = self._exchange(row.copy())
        self.bytes += row.nbytes * (1 + self.world.size)
        return np.stack([rows[self.world.class_of(r)] for r in range(self.world.size)])


def run_classes(world: World, body: Callable[[int, "SimNet"], Any]) -> List[Any]:
    """Run ``body(index, net)`` on one thread per class; returns each class's result."""
    results: List[Any] = [None] * len(world.classes)
    errors: List[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = body(i, SimNet(world, i))
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
            world._barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(world.classes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
