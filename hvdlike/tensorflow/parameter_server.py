"""Asynchronous parameter-server training over MPI, for Keras 3 ``fit``, tf_keras and custom
loops (Keras 3 has no parameter-server training of its own)::

    import hvdlike.tensorflow as hvd
    hvd.init()
    model = make_model()                                      # same model on every rank
    ps = hvd.ParameterServerTraining(model, keras.optimizers.SGD(0.1), num_servers=1)
    model.compile(optimizer=ps.optimizer, loss="sparse_categorical_crossentropy")
    ps.run(lambda: model.fit(dataset.shard(ps.num_workers, ps.worker_index).repeat(),
                             steps_per_epoch=100, epochs=5, callbacks=[ps.callback()]))
    # here every rank holds the final weights

The last ``num_servers`` ranks are servers, the others workers (worker i is rank i). The
trainable variables are sharded over the servers by bytes. A worker step, once its batch is
there, pulls each server's shard of the weights, computes its gradients on them and pushes
each server its shard of them (in a custom loop, ``apply_gradients`` pushes and then pulls
for the next step); a server applies each push with the user's optimizer as it arrives, so a
slow worker holds nobody back. ``max_staleness`` bounds how far workers drift apart (``0``:
synchronous, equal to ``DistributedOptimizer``); ``lookahead`` sends each pull the weights
moved on along the last update by the worker's mean staleness, about where they will be when
its push is applied; ``total_steps`` ends training after that many applied pushes;
``compression`` narrows the pushes; ``checkpoint_dir`` keeps the servers' shards and
optimizer state. docs/parameter_server.md says how each behaves, with the figures. A
server's loop is ``ps_server.Server``.

Transport: MPI point-to-point on a communicator of its own, inside
``hvdlike.exclusive_mpi()``, so that the training thread is the only one of its process in
MPI (Open MPI 5 over TCP can hang when two are); hvdlike's collectives therefore raise inside
``train``. Non-trainable variables stay on each worker; ``run`` ends by giving every rank the
servers' weights and worker 0's non-trainable ones.
"""
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf

import hvdlike as _core
from hvdlike import runtime
from hvdlike.tensorflow import compat, ps_checkpoint
from hvdlike.tensorflow import ps_messages as msg
from hvdlike.tensorflow.compression import Compression
from hvdlike.tensorflow.ps_optimizer import pull_before_each_step, worker_optimizer
from hvdlike.tensorflow.ps_server import Server


class ParameterServerTraining:
    """Asynchronous parameter-server training of ``model`` with ``optimizer`` (see the module
    docstring). Collective: every rank builds the same model and calls this with the same
    arguments; rank 0's initial weights go to every rank."""

    def __init__(self, model: Any, optimizer: Any, num_servers: int = 1,
                 max_staleness: Optional[int] = None, compression: Any = Compression.none,
                 total_steps: Optional[int] = None, checkpoint_dir: Optional[str] = None,
                 checkpoint_every: int = 100, lookahead: bool = True) -> None:
        st = runtime.state("hvdlike.tensorflow.ParameterServerTraining")
        size = st.size
        if not 1 <= int(num_servers) < size:
            raise ValueError(f"ParameterServerTraining: num_servers must lie in 1..{size - 1} "
                             f"(at least one rank must be a worker), got {num_servers}; run "
                             "with more ranks (e.g. hvdlikerun -np 3 for 1 server + 2 workers)")
        if max_staleness is not None and int(max_staleness) < 0:
            raise ValueError(f"ParameterServerTraining: max_staleness must be None or >= 0, "
                             f"got {max_staleness}")
        if compression not in (Compression.none, Compression.fp16, Compression.bf16):
            raise ValueError("ParameterServerTraining: compression must be Compression.none, "
                             f".fp16 or .bf16, got {compression!r}")
        variables = list(model.trainable_variables)
        if not variables:
            raise ValueError("ParameterServerTraining: the model has no trainable variables; "
                             "build it first (keras.Input(...) as its first layer, or call it "
                             "on a batch)")
        self.model, self.variables = model, variables
        self.num_servers = int(num_servers)
        self.servers = list(range(size - self.num_servers, size))
        self.num_workers = size - self.num_servers
        self.rank = st.rank
        self.is_server = self.rank in self.servers
        self.worker_index = -1 if self.is_server else self.rank
        self.max_staleness = None if max_staleness is None else int(max_staleness)
        self.total_steps = None if total_steps is None else int(total_steps)
        self.checkpoint_dir, self.checkpoint_every = checkpoint_dir, int(checkpoint_every)
        self.lookahead = bool(lookahead) and self.max_staleness != 0
        self._wire = {Compression.none: np.float32, Compression.fp16: np.float16,
                      Compression.bf16: tf.bfloat16.as_numpy_dtype}[compression]
        self._shards = _shard_by_bytes(variables, self.num_servers)
        self._sizes = [int(np.prod(v.shape)) for v in variables]
        self.should_stop = False
        self._failed_server: Optional[int] = None  # a server that answered a pull FAILED
        self.stats: Dict[str, Any] = {}
        self._comm = st.world.Dup()
        from hvdlike.tensorflow.functions import broadcast_variables
        broadcast_variables(model.variables, root_rank=0)
        self._server: Optional[Server] = None
        if self.is_server:
            index = self.servers.index(self.rank)
            file = (ps_checkpoint.path(checkpoint_dir, index, self.num_servers)
                    if checkpoint_dir else None)
            self._server = Server(self._comm, [variables[i] for i in self._shards[index]],
                                  optimizer, self._wire, self.num_workers, self.max_staleness,
                                  self.lookahead, self.total_steps, file, self.checkpoint_every)
        if self.checkpoint_dir:  # workers start from what the servers loaded, if anything
            error = None
            try:
                if self._server is not None:
                    ps_checkpoint.check_writable(self.checkpoint_dir, self.rank)
                    self._server.load()
            except Exception as e:  # every rank raises, not only this server
                error = e
            msg.raise_on_every_rank(error, error is not None, self.rank, self.servers, size,
                                    where="ParameterServerTraining", others=ValueError)
            for server, shard in zip(self.servers, self._shards):
                broadcast_variables([self.variables[i] for i in shard], root_rank=server)
        self.optimizer = worker_optimizer(optimizer, self)
        self.pulls_in_step = False  # True while the model's train_step is traced or run

    # ------------------------------------------------------------------ every rank

    def run(self, train: Callable[[], Any]) -> Any:
        """Workers call ``train()`` (e.g. ``model.fit``), servers serve until every worker is
        done; then every rank gets the final weights. Collective. Returns ``train()``'s result
        on workers, None on servers. Where ``train()`` or a server raises, every rank raises:
        that rank its own error, the others a ``RuntimeError`` that names it."""
        result, error = None, None
        with _core.exclusive_mpi():  # pushes and pulls: no engine thread in MPI meanwhile
            try:
                if self._server is not None:
                    self.stats = self._server.serve()
                else:
                    try:
                        with pull_before_each_step(self.model, self):
                            result = train()
                    finally:
                        self._send_done()
            except Exception as e:  # the others learn of it below instead of waiting for it
                error = e
        msg.raise_on_every_rank(error, error is not None and self._failed_server is None,
                                self.rank, self.servers, self.num_workers + self.num_servers,
                                where="ParameterServerTraining.run", others=RuntimeError)
        self._gather_final_weights()
        return result

    def callback(self) -> Any:
        """A Keras callback that ends ``fit`` once the servers have applied ``total_steps``."""
        trainer = self

        class StopWhenServersSaySo(compat.keras().callbacks.Callback):
            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                if trainer.should_stop:
                    self.model.stop_training = True

        return StopWhenServersSaySo()

    # ------------------------------------------------------------------ workers

    def push_and_pull(self, grads: List[np.ndarray]) -> List[np.ndarray]:
        """Push the gradients (one array per trainable variable, in
        ``model.trainable_variables`` order), then pull the weights for the next step."""
        self.push(grads)
        return self.pull()

    def push(self, grads: List[np.ndarray]) -> None:
        """Send each server its shard of the gradients (returns once they have left)."""
        requests = []
        for server, shard in zip(self.servers, self._shards):
            payload = np.concatenate([np.asarray(grads[i], np.float32).reshape(-1)
                                      for i in shard]).astype(self._wire, copy=False)
            header = np.array([msg.PUSH, 0], np.int64)
            requests.append(self._comm.Isend(header, dest=server, tag=msg.HEADER))
            requests.append(self._comm.Isend(msg.as_bytes(payload), dest=server, tag=msg.PAYLOAD))
        for request in requests:
            msg.wait(request)

    def pull(self) -> List[np.ndarray]:
        """The weights to compute the next gradients on (one array per trainable variable),
        once the staleness bound lets this worker go on."""
        requests = [self._comm.Isend(np.array([msg.PULL, 0], np.int64), dest=server, tag=msg.HEADER)
                    for server in self.servers]
        out: List[Any] = [None] * len(self.variables)
        for server, shard in zip(self.servers, self._shards):
            reply = np.empty(sum(self._sizes[i] for i in shard) + 1, np.float32)
            msg.wait(self._comm.Irecv(reply, source=server, tag=msg.REPLY))
            if reply[-1] == msg.FAILED:
                self._failed_server = server
            elif reply[-1] == msg.STOP:
                self.should_stop = True
            at = 0
            for i in shard:
                out[i] = reply[at:at + self._sizes[i]].reshape(self.variables[i].shape)
                at += self._sizes[i]
        for request in requests:
            request.Wait()
        if self._failed_server is not None:
            raise RuntimeError(f"ParameterServerTraining: server rank {self._failed_server} "
                               "failed; this worker stops (run raises its error on every rank)")
        return out

    def _send_done(self) -> None:
        for server in self.servers:
            self._comm.Send(np.array([msg.DONE, 0], np.int64), dest=server, tag=msg.HEADER)

    # ------------------------------------------------------------------ the end

    def _gather_final_weights(self) -> None:
        """Every rank takes each server's shard, and worker 0's non-trainable variables."""
        from hvdlike.tensorflow.functions import broadcast_variables
        for server, shard in zip(self.servers, self._shards):
            broadcast_variables([self.variables[i] for i in shard], root_rank=server)
        others = [v for v in self.model.variables if not v.trainable]
        if others:
            broadcast_variables(others, root_rank=0)
        self.stats = _core.broadcast_object(self.stats if self.rank == self.servers[0] else None,
                                            root_rank=self.servers[0])
        self.should_stop = False


def _shard_by_bytes(variables: List[Any], num_servers: int) -> List[List[int]]:
    """Variable indices per server: largest first, each to the least loaded server; each
    server's list in the model's order."""
    load = [0] * num_servers
    shards: List[List[int]] = [[] for _ in range(num_servers)]
    nbytes = [int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables]
    for i in sorted(range(len(variables)), key=lambda i: -nbytes[i]):
        target = load.index(min(load))
        shards[target].append(i)
        load[target] += nbytes[i]
    return [sorted(s) for s in shards]
