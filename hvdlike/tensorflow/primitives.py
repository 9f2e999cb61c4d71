"""The collectives on TensorFlow values without gradients, that the ops with gradients
(``.ops``, ``.gather_ops``) are built from and call for each other's gradients; and the
two halves of a graph all-reduce that the gradient code overlaps with backprop
(``allreduce_submit``, ``allreduce_wait``)."""
from typing import Any, List, NamedTuple, Optional, Sequence

import tensorflow as tf

import hvdlike as _core
from hvdlike import collectives
from hvdlike.collectives import packed_allreduce_async
from hvdlike.tensorflow import bridge
from hvdlike.tensorflow.packing import Packing


def allreduce_submit_fn(op, prescale_factor, postscale_factor, name, process_set, parts=None,
                        blocking=False):
    """The submit function of an all-reduce; with ``parts`` (``Packing.parts``), of tensors
    crossing packed (the engine reduces them packed, one result per crossing tensor). With
    ``blocking`` (eager) one tensor is reduced by the blocking call, which runs a cached name
    at once on the calling thread, and the wait function returns its result."""
    def submit(op_name, *arrays):
        kw = dict(op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                  name=name or op_name, process_set=process_set)
        if blocking and len(arrays) == 1:
            return bridge.done(collectives.allreduce(arrays[0], **kw))
        if parts is not None:
            return bridge.many(packed_allreduce_async(arrays, parts, **kw))
        if len(arrays) == 1:
            return bridge.one(_core.allreduce_async(arrays[0], **kw))
        return bridge.many(_core.grouped_allreduce_async(list(arrays), **kw))
    return submit


def allreduce_raw(tensors, op, prescale_factor, postscale_factor, name, process_set):
    """Allreduce a list of dense tensors in ONE fused core call (in a graph, the small ones
    cross packed: ``hvdlike.tensorflow.packing``)."""
    if not tensors:
        return []
    if tf.executing_eagerly():
        submit = allreduce_submit_fn(op, prescale_factor, postscale_factor, name, process_set,
                                     blocking=True)
        return bridge.run("allreduce", submit, tensors, [t.dtype for t in tensors],
                          [t.shape for t in tensors], process_set, name)
    bridge.check_graph_request("allreduce", name, process_set)
    return allreduce_wait([allreduce_submit(tensors, op, prescale_factor, postscale_factor,
                                            name, process_set)])


class Submitted(NamedTuple):
    """A graph all-reduce handed to the engine: its submit op's key, and how its tensors
    cross (``hvdlike.tensorflow.packing.Packing``)."""

    key: tf.Tensor
    packing: Packing
    crossing: List[tf.Tensor]


def allreduce_submit(tensors: Sequence[tf.Tensor], op: Any, prescale_factor: float,
                     postscale_factor: float, name: Optional[str],
                     process_set: _core.ProcessSet) -> Submitted:
    """Graph only: the submit half of an allreduce of dense tensors (one request; grouped when
    there are several), for ``allreduce_wait``."""
    packing = Packing(tensors, op)
    crossing = packing.pack(tensors)
    submit = allreduce_submit_fn(op, prescale_factor, postscale_factor, name, process_set,
                                 packing.parts)
    return Submitted(bridge.submit_op("allreduce", submit, crossing), packing, crossing)


def allreduce_wait(submitted: Sequence[Submitted]) -> List[tf.Tensor]:
    """Graph only: one op that waits for the allreduces ``submitted`` (from
    ``allreduce_submit``); returns their results, one request after the other."""
    crossing = [c for s in submitted for c in s.crossing]
    outs = bridge.wait_op("allreduce", [s.key for s in submitted], [c.dtype for c in crossing],
                          [c.shape for c in crossing])
    results, at = [], 0
    for s in submitted:
        results += s.packing.unpack(outs[at:at + len(s.crossing)])
        at += len(s.crossing)
    return results


def gathered_shape(shape, process_set):
    if shape.rank is None:
        return tf.TensorShape(None)
    dims = shape.as_list()
    first = dims[0] if (bridge.ps_size(process_set) == 1 and dims) else None
    return tf.TensorShape([first] + dims[1:]) if dims else tf.TensorShape(None)


def allgather_raw(tensors, name, process_set):
    def submit(op_name, *arrays):
        if len(arrays) == 1:
            return bridge.one(_core.allgather_async(arrays[0], name=name or op_name,
                                                    process_set=process_set))
        return bridge.many(_core.grouped_allgather_async(list(arrays), name=name or op_name,
                                                         process_set=process_set))
    return bridge.run("allgather", submit, tensors, [t.dtype for t in tensors],
                      [gathered_shape(t.shape, process_set) for t in tensors], process_set, name)
