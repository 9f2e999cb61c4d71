"""Sharding a tf.data.Dataset across ranks.

``shard_dataset(ds, policy="DATA")`` keeps every ``size()``-th element starting at
``rank()`` (tf.data's ``AutoShardPolicy.DATA``): every rank reads all input but keeps
a disjoint 1/size of the elements.  ``policy="FILE"`` shards a dataset of file names
(``AutoShardPolicy.FILE``): rank r reads files r, r+size, ...; call it on the file list
*before* ``interleave``/reading.  Shard before ``batch``: with a per-rank batch of b,
one synchronous step then consumes ``b * size()`` distinct elements (the global
batch), exactly as a single process with batch ``b * size()`` would.  Sharding an
already-batched dataset instead distributes whole batches (global batch still
``b * size()``, but different element-to-step assignment).
"""
from typing import Any, Optional

import tensorflow as tf

from hvdlike import ProcessSet, global_process_set
from hvdlike import process_sets as _process_sets


def shard_dataset(dataset: Any, policy: str = "DATA", num_shards: Optional[int] = None,
                  index: Optional[int] = None,
                  process_set: ProcessSet = global_process_set) -> Any:
    """Return this rank's shard of ``dataset`` (``policy``: "DATA" or "FILE").

    Every rank passes the same dataset (same element order).  ``num_shards``/``index``
    default to the process set's size and this rank's index in it.  With ``"FILE"``
    the number of files must be at least the number of ranks (otherwise some ranks
    get no data: use ``"DATA"``).
    """
    policy = str(getattr(policy, "name", policy)).upper()
    if policy not in ("DATA", "FILE"):
        raise ValueError(f"hvdlike shard_dataset: policy must be 'DATA' or 'FILE' (got "
                         f"{policy!r}); 'AUTO'/'HINT' are not supported.")
    if num_shards is None or index is None:  # from the process set: it must be usable here
        _process_sets.require_member(process_set, "hvdlike.tensorflow.shard_dataset",
                                     "it has no shard of it: pass num_shards and index, or "
                                     "shard only on the set's ranks")
    n = process_set.size() if num_shards is None else int(num_shards)
    i = process_set.rank() if index is None else int(index)
    if policy == "FILE":
        spec = dataset.element_spec
        if not (isinstance(spec, tf.TensorSpec) and spec.dtype == tf.string
                and spec.shape.rank == 0):
            raise ValueError("hvdlike shard_dataset(policy='FILE') expects a dataset of "
                             "file names (scalar tf.string elements), e.g. "
                             "tf.data.Dataset.list_files(pattern, shuffle=False); got "
                             f"element_spec={spec}. Use policy='DATA' for other datasets.")
        card = int(dataset.cardinality())
        if card >= 0 and card < n:
            raise ValueError(f"hvdlike shard_dataset(policy='FILE'): {card} files for {n} "
                             "ranks; some ranks would get no data. Use policy='DATA'.")
    return dataset.shard(n, i)
