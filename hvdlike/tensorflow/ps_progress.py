"""What a parameter server knows of its workers' progress, kept in O(1) per message however
many workers there are: pushes per worker, the fewest pushes of a worker still training
(which the staleness bound measures against), and which workers a synchronous step still
waits for."""
from collections import Counter
from typing import List, Set


class WorkerProgress:
    def __init__(self, workers: int) -> None:
        self.pushes: List[int] = [0] * workers
        self.active: Set[int] = set(range(workers))  # workers still training
        self.slowest = 0  # the fewest pushes of an active worker (0 once none is left)
        self.step_waits_for: Set[int] = set(self.active)  # synchronous: not pushed this step
        self._active_at = Counter({0: workers})  # active workers per push count

    def pushed(self, worker: int) -> None:
        count = self.pushes[worker]
        self.pushes[worker] = count + 1
        if worker in self.active:
            self._active_at[count] -= 1
            self._active_at[count + 1] += 1
            self._move_slowest()

    def done(self, worker: int) -> None:
        if worker in self.active:
            self.active.discard(worker)
            self.step_waits_for.discard(worker)
            self._active_at[self.pushes[worker]] -= 1
            self._move_slowest()

    def summed(self, worker: int) -> None:
        """Synchronous: ``worker``'s push is in this step's sum."""
        self.step_waits_for.discard(worker)

    def next_step(self) -> None:
        """A synchronous step was applied: the next one waits for every active worker."""
        self.step_waits_for = set(self.active)

    def _move_slowest(self) -> None:
        # only ever up: at most one step per push in all, whatever the number of workers
        if not self.active:
            self.slowest = 0
            return
        while self._active_at[self.slowest] == 0:
            del self._active_at[self.slowest]
            self.slowest += 1
