"""Broadcasting and gathering TensorFlow state and Python objects."""
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

import hvdlike as _core
from hvdlike import ProcessSet, global_process_set
from hvdlike.base.tracebacks import short
from hvdlike.tensorflow import bridge


def _fused_broadcast(root_rank, process_set):
    """Submit function for ``bridge.run``: broadcast many arrays, one request per dtype."""
    def submit(_op_name, *arrays):
        by_dtype = {}
        for i, a in enumerate(arrays):
            by_dtype.setdefault(np.dtype(a.dtype), []).append(i)
        pending = []
        for dt, idx in sorted(by_dtype.items(), key=lambda kv: kv[0].str):
            flat = np.concatenate([np.ravel(arrays[i]) for i in idx])
            pending.append((idx, _core.broadcast_async(
                flat, root_rank, name=f"broadcast_variables/{dt.name}", process_set=process_set)))

        def wait():
            out = [None] * len(arrays)
            for idx, handle in pending:
                flat, off = handle.synchronize(), 0
                for i in idx:
                    n = arrays[i].size
                    out[i] = flat[off:off + n].reshape(arrays[i].shape)
                    off += n
            return out
        return bridge.Wait([handle for _, handle in pending], wait)
    return submit


@short
def broadcast_variables(variables: Sequence[Any], root_rank: int,
                        process_set: ProcessSet = global_process_set,
                        inplace: bool = False) -> Any:
    """Assign ``root_rank``'s values to ``variables`` on every rank.

    Every rank passes the same list of variables (same order, dtypes and shapes),
    e.g. ``model.variables`` or ``optimizer.variables``.  Variables are fused into one
    broadcast per dtype.  Works eagerly and inside ``tf.function``; returns ``None``
    in TF2 and the grouped assign op in a TF1 graph.
    """
    assigns = _broadcast_assigns(_variables(variables, "broadcast_variables"), root_rank,
                                 process_set)
    if not assigns or tf.compat.v1.executing_eagerly_outside_functions():
        return None  # eager, or inside tf.function (automatic control dependencies)
    return tf.group(*[a for a in assigns if a is not None])


def _variables(variables: Any, what: str) -> List[Any]:
    """The variables given to ``what``: a list (or other sequence) of variables."""
    if hasattr(variables, "assign"):
        raise TypeError(f"hvdlike.tensorflow.{what} takes a list of variables, got one "
                        f"{type(variables).__name__}; pass [v]")
    variables = list(variables)
    for i, v in enumerate(variables):
        if not hasattr(v, "assign"):
            raise TypeError(f"hvdlike.tensorflow.{what} takes variables (e.g. model.variables), "
                            f"got a {type(v).__name__} at position {i}; to send a tensor's "
                            "value use hvdlike.tensorflow.broadcast(tensor, root_rank)")
    return variables


def _broadcast_assigns(variables, root_rank, process_set):
    """Assign ``root_rank``'s values to ``variables``; the assign ops' results (ref and
    resource variables alike)."""
    if not variables:
        return []
    for v in variables:
        dtype = tf.as_dtype(v.dtype).base_dtype  # a TF1 RefVariable's dtype is e.g. float32_ref
        if dtype not in bridge.SUPPORTED_DTYPES:
            raise TypeError(f"hvdlike.tensorflow.broadcast_variables: variable "
                            f"{getattr(v, 'name', '?')!r} has dtype {dtype.name},"
                            " which cannot be broadcast; use broadcast_object for it.")
    values = [tf.convert_to_tensor(v) for v in variables]
    outs = bridge.run("broadcast_variables", _fused_broadcast(root_rank, process_set),
                      values, [t.dtype for t in values], [t.shape for t in values], process_set)
    return [v.assign(o) for v, o in zip(variables, outs)]


def broadcast_(variables: Sequence[Any], root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> List[Any]:
    """Horovod's in-place broadcast: assign ``root_rank``'s values to ``variables`` (see
    ``broadcast_variables``) and return them; in a ``tf.compat.v1`` graph, return the
    assign ops' results, which broadcast and assign when run."""
    variables = _variables(variables, "broadcast_")
    if tf.compat.v1.executing_eagerly_outside_functions():
        broadcast_variables(variables, root_rank, process_set=process_set)
        return variables
    return _broadcast_assigns(variables, root_rank, process_set)  # TF1 graph: run these


def broadcast_global_variables(root_rank: int) -> Any:
    """TF1 graph mode only: broadcast all ``tf.compat.v1`` global variables.

    In TF2 (eager or tf.function) there is no global-variables collection: use
    ``broadcast_variables(model.variables, root_rank)`` or the Keras
    ``BroadcastGlobalVariablesCallback`` instead.
    """
    if tf.executing_eagerly() or tf.compat.v1.executing_eagerly_outside_functions():
        raise RuntimeError(
            "hvdlike.tensorflow.broadcast_global_variables does not work in TF2 eager mode "
            "or tf.function (there is no global variables collection). Use "
            "hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0) "
            "or hvdlike.keras.callbacks.BroadcastGlobalVariablesCallback(0).")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def _plain(obj, session=None):
    """``obj`` with the TensorFlow values in it (also inside dicts, lists and tuples, whatever
    their keys) as NumPy arrays; graph tensors are evaluated in ``session`` (or the default
    session). Never raises: what cannot be converted stays as it is, and the core then reports
    that it cannot be pickled, on every rank."""
    if isinstance(obj, dict):
        items = {k: _plain(v, session) for k, v in obj.items()}
        return obj if all(items[k] is v for k, v in obj.items()) else items
    if isinstance(obj, (list, tuple)):
        values = [_plain(v, session) for v in obj]
        if all(a is b for a, b in zip(values, obj)):
            return obj
        return type(obj)(*values) if hasattr(obj, "_fields") else type(obj)(values)
    if isinstance(obj, (tf.Tensor, tf.Variable)):
        try:
            if tf.executing_eagerly():
                return obj.numpy()
            session = session or tf.compat.v1.get_default_session()
            return session.run(obj) if session is not None else obj
        except Exception:  # noqa: BLE001 - left for the core's pickling error, on every rank
            return obj
    return obj


@short
def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None,
                     name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s ``obj`` (any picklable value; TF tensors as NumPy) on every rank.
    In a tf.compat.v1 graph, tensors in ``obj`` are evaluated in ``session`` (default: the
    default session)."""
    if _core.rank() == root_rank:
        obj = _plain(obj, session)
    return _core.broadcast_object(obj, root_rank=root_rank, name=name, process_set=process_set)


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: Optional[str] = None,
                        process_set: ProcessSet = global_process_set
                        ) -> Callable[[Any], Any]:
    """A function ``fn(obj)`` that returns ``root_rank``'s ``obj`` on every rank (Horovod's
    name; see ``broadcast_object``)."""
    def fn(obj):
        return broadcast_object(obj, root_rank, session, name, process_set)
    return fn


@short
def allgather_object(obj: Any, session: Any = None, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Return ``[obj of rank 0, obj of rank 1, ...]`` on every rank (TF tensors as NumPy)."""
    return _core.allgather_object(_plain(obj, session), name=name, process_set=process_set)
