"""One parameter server of ``ParameterServerTraining``: its shard of the trainable variables,
each worker's push applied with the user's optimizer as it arrives (with ``max_staleness=0``,
the mean of one push per worker), pulls answered as the staleness bound allows, checkpoints,
and the statistics of a run."""
import time
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np
import tensorflow as tf

from hvdlike import runtime
from hvdlike.tensorflow import ps_checkpoint
from hvdlike.tensorflow import ps_messages as msg
from hvdlike.tensorflow.ps_progress import WorkerProgress


class Server:
    """Serves ``variables`` (this server's shard, in the model's order) to ``num_workers``
    workers over ``comm``; pushes arrive as ``wire_dtype``. ``lookahead``: send each pull the
    weights moved on along the last update by the worker's mean staleness. ``total_steps``:
    pushes past that many are discarded and answered "stop". ``checkpoint_file``: where the
    shard and the optimizer's state are saved every ``checkpoint_every`` updates and at the
    end of each run (None: never)."""

    def __init__(self, comm: Any, variables: List[Any], optimizer: Any, wire_dtype: Any,
                 num_workers: int, max_staleness: Optional[int], lookahead: bool,
                 total_steps: Optional[int], checkpoint_file: Optional[str],
                 checkpoint_every: int) -> None:
        self.comm, self.variables, self.optimizer = comm, variables, optimizer
        self.sizes = [int(np.prod(v.shape)) for v in variables]
        self.wire = np.empty(sum(self.sizes), wire_dtype)
        self.num_workers, self.max_staleness = num_workers, max_staleness
        self.lookahead, self.total_steps = lookahead, total_steps
        self.checkpoint_file, self.checkpoint_every = checkpoint_file, checkpoint_every
        self.updates = 0  # updates applied to the shard, over every run (and checkpoint)
        self.pushes_applied = 0  # pushes applied or summed: what total_steps counts
        self._apply_fn: Any = None

    # ------------------------------------------------------------------ a run

    def serve(self) -> Dict[str, Any]:
        """Apply pushes and answer pulls until every worker is done; returns the run's
        statistics. A failure here still answers every worker (``FAILED``) until it is done."""
        self._begin()
        header = np.empty(2, np.int64)
        mpi = runtime.state().mpi
        status, any_source = mpi.Status(), mpi.ANY_SOURCE
        try:
            while self.progress.active:
                msg.wait(self.comm.Irecv(header, source=any_source, tag=msg.HEADER), status)
                worker = status.Get_source()
                pull = None
                if header[0] == msg.DONE:
                    self.progress.done(worker)
                elif header[0] == msg.PULL:
                    pull = worker
                    self.waiting.add(worker)
                else:
                    self.comm.Recv(msg.as_bytes(self.wire), source=worker, tag=msg.PAYLOAD)
                    if not self._take(worker, self.wire.astype(np.float32, copy=False)):
                        continue  # past total_steps: its pull is answered "stop"
                self._end_step_if_complete()
                if self.checkpoint_file and self.updates - self.saved_at >= self.checkpoint_every:
                    self.save()
                self._answer(pull)
        except Exception:  # no worker may wait for this server forever
            msg.answer_failed_until_done(self.comm, any_source, status, self.progress.active,
                                         self.waiting, self.wire.size, self.wire.nbytes)
            raise
        if self.checkpoint_file:
            self.save()
        return self._stats()

    def _begin(self) -> None:
        self.progress = WorkerProgress(self.num_workers)
        workers = self.progress.active
        self.waiting: Set[int] = set()  # workers whose pull is not answered yet
        self.held: List[int] = []  # of those, the ones the staleness bound holds back
        self.held_at = 0  # the slowest worker's pushes when ``held`` was last looked at
        n = self.wire.size
        self.summed, self.summed_from = np.zeros(n, np.float32), 0  # max_staleness=0
        self.sent: Dict[int, np.ndarray] = {}  # the weights each worker got last
        self.version_sent = {w: self.updates for w in workers}  # ``updates`` it got them at
        self.latest, self.latest_version = np.empty(0, np.float32), -1  # the last reply's
        self.before = np.empty(0, np.float32)  # the weights before the last update
        # per worker: the sum and count of its pushes' staleness (the updates applied
        # between its pull and its push)
        self.stale = {w: [0, 0] for w in workers}
        self.most_stale = self.lead = self.discarded = 0  # lead: the most pushes a worker
        self.drift = 0.0  # was ahead of the slowest at its reply; drift: a sum
        self.saved_at = self.updates
        self.start = time.perf_counter()

    def _take(self, worker: int, grad: np.ndarray) -> bool:
        """Apply (or sum) ``worker``'s push; False when it comes past ``total_steps``."""
        self.progress.pushed(worker)
        if self.total_steps is not None and self.pushes_applied >= self.total_steps:
            self.discarded += 1
            return False
        self.pushes_applied += 1
        behind = self.updates - self.version_sent[worker]
        self.stale[worker][0] += behind
        self.stale[worker][1] += 1
        self.most_stale = max(self.most_stale, behind)
        if worker in self.sent and behind:
            now = self._weights_now()
            self.drift += float(np.linalg.norm(now - self.sent[worker])
                                / max(np.linalg.norm(now), 1e-30))
        if self.max_staleness == 0:
            self.summed += grad
            self.summed_from += 1
            self.progress.summed(worker)
        else:
            if self.lookahead:
                self.before = self._weights_now()
            self._apply(grad)
            self.updates += 1
        return True

    def _end_step_if_complete(self) -> None:
        """``max_staleness=0``: apply the mean once every active worker has pushed."""
        if self.max_staleness == 0 and self.summed_from and not self.progress.step_waits_for:
            self._apply(self.summed / self.summed_from)
            self.updates += 1
            self.summed_from = 0
            self.summed[:] = 0
            self.progress.next_step()

    def _answer(self, pull: Optional[int]) -> None:
        """Reply to ``pull`` and, once the slowest worker has moved on, to the pulls held back
        before; hold back the ones the staleness bound does not let go yet."""
        slowest = self.progress.slowest
        pulls = [] if pull is None else [pull]
        if self.held and slowest != self.held_at:
            pulls, self.held = self.held + pulls, []
        self.held_at = slowest
        pushes = self.progress.pushes
        for w in pulls:
            if self.max_staleness is not None and pushes[w] - slowest > self.max_staleness:
                self.held.append(w)
                continue
            self.version_sent[w] = self.updates
            self.lead = max(self.lead, pushes[w] - slowest)
            stop = self.total_steps is not None and self.pushes_applied >= self.total_steps
            count = self.stale[w][1]  # expected staleness of its next push: the mean so far
            ahead = self.stale[w][0] / count if self.lookahead and self.before.size and count else 0.0
            self.latest, self.sent[w] = self._reply(w, stop, ahead)
            self.latest_version = self.updates
            self.waiting.discard(w)

    def _stats(self) -> Dict[str, Any]:
        counted = sum(n for _, n in self.stale.values())
        total = sum(t for t, _ in self.stale.values())
        return {"updates": self.updates, "pushes": dict(enumerate(self.progress.pushes)),
                "discarded": self.discarded,
                "mean_staleness": total / counted if counted else 0.0,
                "max_staleness": self.most_stale,
                "mean_staleness_by_worker": {w: t / n for w, (t, n) in sorted(self.stale.items())
                                             if n},
                "max_lead": self.lead,
                "mean_drift": self.drift / counted if counted else 0.0,
                "seconds": time.perf_counter() - self.start}

    # ------------------------------------------------------------------ the shard

    def _weights_now(self) -> np.ndarray:
        """The shard's weights: the last reply's, if nothing was applied since."""
        return self.latest if self.latest_version == self.updates else self._weights()

    def _weights(self, extra: int = 0) -> np.ndarray:
        """The shard's weights, flat, in a new array with ``extra`` more elements after."""
        parts = [np.asarray(v.numpy(), np.float32).reshape(-1) for v in self.variables]
        n = sum(p.size for p in parts)
        out = np.empty(n + extra, np.float32)
        np.concatenate(parts, out=out[:n])
        return out

    def _reply(self, worker: int, stop: bool, ahead: float) -> Tuple[np.ndarray, np.ndarray]:
        """Send ``worker`` the shard's weights (and whether to stop), moved ``ahead`` times
        the last update (the weights minus ``before``) further on: about where the updates
        applied while the worker computes its next push will have taken them. Returns the
        weights and what was sent."""
        message = self._weights(extra=1)
        now = message[:-1]
        if ahead:
            now = now.copy()
            message[:-1] += ahead * (now - self.before)
        message[-1] = msg.STOP if stop else msg.GO
        self.comm.Send(message, dest=worker, tag=msg.REPLY)
        return now, message[:-1]

    def _apply(self, flat: np.ndarray) -> None:
        """Apply the gradients ``flat`` (the shard's, flat) with the user's optimizer."""
        if self._apply_fn is None:  # traced once: eager apply_gradients costs milliseconds
            optimizer, variables = self.optimizer, self.variables

            @tf.function
            def apply(grads: List[tf.Tensor]) -> None:
                optimizer.apply_gradients(zip(grads, variables))

            self._apply_fn = apply
        grads, at = [], 0
        for v, size in zip(self.variables, self.sizes):
            grads.append(tf.constant(flat[at:at + size].reshape(v.shape), dtype=v.dtype))
            at += size
        self._apply_fn(grads)

    def save(self) -> None:
        ps_checkpoint.save(self.checkpoint_file or "", self.variables, self.optimizer,
                           self.updates, self.pushes_applied)
        self.saved_at = self.updates

    def load(self) -> None:
        """Restore the shard, the optimizer's state and the counts from the checkpoint file,
        if there is one."""
        counts = ps_checkpoint.load(self.checkpoint_file or "", self.variables, self.optimizer)
        if counts:
            self.updates, self.pushes_applied = counts["updates"], counts["pushes_applied"]
