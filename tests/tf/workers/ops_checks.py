"""Checks of the TF collectives (eager, tf.function, gradients) on every rank.

Expected values are computed locally from the deterministic per-rank inputs
(a single-process reference of the same math).
"""
from common import check, close, assert_close, hvd, np, tf

r, n = hvd.rank(), hvd.size()


def x_of(k, shape=(2, 3), dtype=np.float32):
    return (np.arange(np.prod(shape)).reshape(shape) + 10 * k + 1).astype(dtype)


ALL = [x_of(k) for k in range(n)]


@check("allreduce_average_eager")
def _():
    y = hvd.allreduce(tf.constant(x_of(r)))
    assert isinstance(y, tf.Tensor) and y.dtype == tf.float32 and y.shape == (2, 3)
    assert_close(y, np.mean(ALL, axis=0))


@check("allreduce_ops_and_scaling")
def _():
    x = tf.constant(x_of(r))
    assert_close(hvd.allreduce(x, op=hvd.Sum), np.sum(ALL, axis=0))
    assert_close(hvd.allreduce(x, op=hvd.Min), np.min(ALL, axis=0))
    assert_close(hvd.allreduce(x, op=hvd.Max), np.max(ALL, axis=0))
    assert_close(hvd.allreduce(x, op=hvd.Product), np.prod(ALL, axis=0))
    assert_close(hvd.allreduce(x, average=False), np.sum(ALL, axis=0))
    assert_close(hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0),
                 1.5 * np.sum(ALL, axis=0), rtol=1e-6)


@check("allreduce_variable_and_int_dtypes")
def _():
    v = tf.Variable(x_of(r))
    assert_close(hvd.allreduce(v, op=hvd.Sum), np.sum(ALL, axis=0))
    for dt in (tf.int32, tf.int64, tf.float64, tf.float16, tf.bfloat16, tf.uint8, tf.int8):
        y = hvd.allreduce(tf.cast(tf.constant(x_of(r)), dt), op=hvd.Sum)
        assert y.dtype == dt, (y.dtype, dt)
        assert_close(tf.cast(y, tf.float64), np.sum(ALL, axis=0), rtol=1e-2)
    b = hvd.allreduce(tf.constant([True, r == 0]), op=hvd.Max)
    assert b.dtype == tf.bool and b.numpy().tolist() == [True, True]


@check("allreduce_in_tf_function_static_shape")
def _():
    @tf.function
    def f(x):
        y = hvd.allreduce(x * 2.0)
        assert y.shape.as_list() == [2, 3], y.shape
        return y + 1.0
    assert_close(f(tf.constant(x_of(r))), 2 * np.mean(ALL, axis=0) + 1.0)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def g(x):
        y = hvd.allreduce(x, op=hvd.Sum)
        assert y.shape.as_list() == [None, 3]
        return y
    assert_close(g(tf.constant(x_of(r))), np.sum(ALL, axis=0))


@check("allreduce_gradient_is_allreduce_of_gradient")
def _():
    x = tf.constant(x_of(r))
    w = [np.float32(k + 1) for k in range(n)]
    for op in (hvd.Average, hvd.Sum):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = hvd.allreduce(x, op=op)
            loss = tf.reduce_sum(y * w[r])
        g = tape.gradient(loss, x)
        expect = np.full((2, 3), np.mean(w) if op == hvd.Average else np.sum(w), np.float32)
        assert_close(g, expect)

    @tf.function
    def gf(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(hvd.allreduce(x) * w[r])
        return tape.gradient(loss, x)
    assert_close(gf(x), np.full((2, 3), np.mean(w), np.float32))


@check("grouped_allreduce_eager_and_function_with_gradient")
def _():
    xs = [tf.constant(x_of(r)), tf.constant(x_of(r, (4,), np.float64)),
          tf.constant(x_of(r, (3,), np.int32))]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum)
    assert [y.shape.as_list() for y in ys] == [[2, 3], [4], [3]]
    assert_close(ys[0], np.sum(ALL, axis=0))
    assert_close(ys[1], np.sum([x_of(k, (4,), np.float64) for k in range(n)], axis=0))
    assert ys[2].dtype == tf.int32
    assert_close(ys[2], np.sum([x_of(k, (3,), np.int32) for k in range(n)], axis=0))
    ys2 = tf.function(lambda a, b: hvd.grouped_allreduce([a, b]))(xs[0], xs[1])
    assert_close(ys2[0], np.mean(ALL, axis=0))
    with tf.GradientTape() as tape:
        tape.watch(xs[0])
        tape.watch(xs[1])
        a, b = hvd.grouped_allreduce(xs[:2])
        loss = tf.reduce_sum(a) * (r + 1) + tf.cast(tf.reduce_sum(b), tf.float32)
    ga, gb = tape.gradient(loss, xs[:2])
    assert_close(ga, np.full((2, 3), np.mean(np.arange(n) + 1), np.float32))
    assert_close(gb, np.ones(4))


def _submit_and_wait_ops(fn, *args):
    """The graph's allreduce submit op and wait op (tf.numpy_function ops) of ``fn``."""
    ops = fn.get_concrete_function(*args).graph.get_operations()
    submit = [o for o in ops if o.name.startswith("HvdlikeAllreduce") and "Wait" not in o.name]
    wait = [o for o in ops if o.name.startswith("HvdlikeAllreduceWait")]
    assert len(submit) == 1 and len(wait) == 1, [o.name for o in ops]
    return submit[0], wait[0]


@check("small_tensors_cross_a_graph_packed_and_come_back_in_their_shapes")
def _():
    # in a graph, the tensors under 64 KiB of each dtype cross into Python as one flat tensor
    # (hvdlike.tensorflow.packing): one submit input and one wait output per dtype
    specs = [((2, 3), np.float32), ((), np.float32), ((0,), np.float32), ((5,), np.float64),
             ((130, 130), np.float32), ((2, 2), np.float64), ((4, 1, 2), np.int32),
             ((7,), np.float32)]  # (130, 130) float32 is 66 KiB: crosses as it is
    xs = [tf.constant(x_of(r, s, d)) for s, d in specs] + [tf.constant([r == 0, False, True])]
    summed = tf.function(lambda *a: hvd.grouped_allreduce(list(a), op=hvd.Sum))
    ys = summed(*xs)
    for (shape, dtype), y in zip(specs, ys):
        assert y.dtype == dtype and tuple(y.shape) == shape, (y.dtype, y.shape, shape)
        assert_close(y, np.sum([x_of(k, shape, dtype) for k in range(n)], axis=0))
    assert ys[-1].dtype == tf.bool and ys[-1].numpy().tolist() == [True, False, True]
    submit, wait = _submit_and_wait_ops(summed, *xs)
    # float32 small (4 tensors), float64 (2), the large one, int32, bool
    crossing = (len(submit.inputs), len(wait.outputs))
    assert crossing == (5, 5), crossing
    floats = [x for x, (_, d) in zip(xs, specs) if d != np.int32]
    averaged = tf.function(lambda *a: hvd.grouped_allreduce(list(a), postscale_factor=3.0))
    for (shape, dtype), y in zip([sd for sd in specs if sd[1] != np.int32], averaged(*floats)):
        assert_close(y, 3 * np.mean([x_of(k, shape, dtype) for k in range(n)], axis=0))

    @tf.function
    def gradients(a, b, big):
        with tf.GradientTape() as tape:
            tape.watch([a, b, big])
            ya, yb, ybig = hvd.grouped_allreduce([a, b, big])
            loss = (tf.reduce_sum(ya) * (r + 1) + tf.reduce_sum(yb) * (r + 2)
                    + tf.reduce_sum(ybig))
        return tape.gradient(loss, [a, b, big])
    ga, gb, gbig = gradients(xs[0], xs[7], xs[4])
    assert_close(ga, np.full((2, 3), np.mean(np.arange(n) + 1), np.float32))
    assert_close(gb, np.full((7,), np.mean(np.arange(n) + 2), np.float32))
    assert_close(gbig, np.ones((130, 130), np.float32))


@check("packed_graph_allreduce_takes_zeros_from_joined_ranks")
def _():
    # small tensors cross a graph packed, one array in the engine: ranks that have joined
    # take part with zeros of that array's shape. Rank k has k + 1 steps.
    summed = tf.function(lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum))
    for step in range(r + 1):
        ya, yb = summed(tf.fill([2, 3], step + 1.0), tf.fill([4], 10.0 * (step + 1)))
        ranks_in = n - step  # the ranks that have a step `step`
        assert_close(ya, np.full((2, 3), (step + 1) * ranks_in, np.float32))
        assert_close(yb, np.full((4,), 10 * (step + 1) * ranks_in, np.float32))
    assert int(hvd.join()) == n - 1


@check("large_eager_results_stay_intact_while_held")
def _():
    # large host results become tensors sharing the core's result memory (DLPack); the core
    # must not hand that memory out again while a tensor holds it
    big = (1 << 21) + 3  # 8 MiB of float32: single copy on one node, a 64-byte-aligned slab
    held = []
    for k in range(6):
        for dt in (np.float32, np.float16, np.int64, np.uint8):
            x = np.full(big if dt == np.float32 else 70_001, (r + 1) * (k + 1) % 60, dt)
            y = hvd.allreduce(tf.constant(x), op=hvd.Sum)
            assert y.dtype.as_numpy_dtype == dt, (y.dtype, dt)
            held.append((y, sum((q + 1) * (k + 1) % 60 for q in range(n))))
        parts = [np.full(big, r + k, np.float32), np.full((300, 257), -r - k, np.float32),
                 np.full(5, r * k, np.float32)]
        outs = hvd.grouped_allreduce([tf.constant(p) for p in parts], op=hvd.Sum)
        held += [(outs[0], sum(q + k for q in range(n))), (outs[2], sum(q * k for q in range(n)))]
        del outs  # the slab's middle view goes; the others keep the slab
    for y, want in held:
        v = y.numpy()
        assert (v == want).all(), (y.dtype, y.shape, want, np.unique(v)[:5])


@check("allgather_uneven_first_dim_and_gradient")
def _():
    x = tf.constant(np.full((r + 1, 2), r, np.float32))
    expect = np.concatenate([np.full((k + 1, 2), k, np.float32) for k in range(n)])
    assert_close(hvd.allgather(x), expect)

    @tf.function
    def f(x):
        y = hvd.allgather(x)
        assert y.shape.as_list() == [None if n > 1 else 1, 2], y.shape
        return y
    assert_close(f(x), expect)
    # the gradient of allgather averages the incoming gradients c_r over ranks (Horovod's
    # rule) and keeps this rank's rows
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(hvd.allgather(x) * float(r + 1))
    assert_close(tape.gradient(loss, x),
                 np.full((r + 1, 2), sum(range(1, n + 1)) / n, np.float32))
    ys = hvd.grouped_allgather([x, tf.constant([r], tf.int64)])
    assert_close(ys[0], expect)
    assert ys[1].numpy().tolist() == list(range(n))


@check("broadcast_and_gradient_reduced_to_root")
def _():
    for root in range(n):
        y = hvd.broadcast(tf.constant(x_of(r)), root_rank=root)
        assert_close(y, x_of(root))
    yi = tf.function(lambda t: hvd.broadcast(t, 0))(tf.constant([r, r], tf.int64))
    assert yi.numpy().tolist() == [0, 0]
    x = tf.constant(x_of(r))
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(hvd.broadcast(x, root_rank=n - 1) * float(r + 1))
    g = tape.gradient(loss, x)
    expect = sum(range(1, n + 1)) / n if r == n - 1 else 0.0  # averaged, as in Horovod
    assert_close(g, np.full((2, 3), expect, np.float32))


@check("alltoall_even_and_explicit_splits_with_gradient")
def _():
    x = tf.constant(np.arange(2 * n, dtype=np.float32) + 100 * r)
    y = hvd.alltoall(x)  # without splits: the received rows only, as in Horovod
    assert_close(y, np.array([100 * k + 2 * r + j for k in range(n) for j in range(2)],
                             np.float32))
    _, rs = hvd.alltoall(x, splits=[2] * n)
    assert rs.numpy().tolist() == [2] * n
    splits = [k + 1 for k in range(n)]  # send k+1 rows to rank k
    x2 = tf.constant(np.full((sum(splits), 1), r, np.float32))
    y2, rs2 = hvd.alltoall(x2, splits=splits)
    assert rs2.numpy().tolist() == [r + 1] * n
    assert_close(y2, np.concatenate([np.full((r + 1, 1), k, np.float32) for k in range(n)]))
    with tf.GradientTape() as tape:
        tape.watch(x2)
        y3, _ = hvd.alltoall(x2, splits=splits)
        loss = tf.reduce_sum(y3 * float(r + 1))
    g = tape.gradient(loss, x2)
    assert_close(g, np.concatenate([np.full((k + 1, 1), k + 1, np.float32) for k in range(n)]))


@check("bad_alltoall_splits_raise_invalid_argument_on_every_rank")
def _():
    # rank 0's splits do not sum to its first dimension; every rank raises Horovod's class,
    # eager and in a graph (where TensorFlow makes it InvalidArgumentError itself); eager it
    # is also the ValueError the NumPy API raises
    def call(x):
        return hvd.alltoall(x, splits=[3 if r == 0 else 1] * n, name="bad_splits")[0]

    x = tf.zeros([n, 2])
    for run, also in ((call, ValueError), (tf.function(call), tf.errors.InvalidArgumentError)):
        try:
            run(x)
        except tf.errors.InvalidArgumentError as e:
            assert isinstance(e, also), type(e).__mro__
            assert "alltoall splits must be" in str(e) and "rank 0" in str(e), e
        else:
            raise AssertionError("no error")
    hvd.barrier()


@check("reducescatter_static_shape_values_and_gradient")
def _():
    rows = 2 * n + 1
    xs = [np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) * (k + 1) for k in range(n)]
    sizes = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    off = sum(sizes[:r])
    for op, red in ((hvd.Sum, np.sum), (hvd.Average, np.mean)):
        y = hvd.reducescatter(tf.constant(xs[r]), op=op)
        assert_close(y, red(xs, axis=0)[off:off + sizes[r]], rtol=1e-6)

    @tf.function
    def f(x):
        y = hvd.reducescatter(x, op=hvd.Sum)
        assert y.shape.as_list() == [sizes[r], 2], y.shape
        return y
    assert_close(f(tf.constant(xs[r])), np.sum(xs, axis=0)[off:off + sizes[r]])
    x = tf.constant(xs[r])
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(hvd.reducescatter(x, op=hvd.Average) * float(r + 1))
    g = tape.gradient(loss, x)  # Horovod's rule: Average's gradient is the allgather
    expect = np.concatenate([np.full((sizes[k], 2), k + 1, np.float32) for k in range(n)])
    assert_close(g, expect)
    gs = hvd.grouped_reducescatter([x, x * 2], op=hvd.Sum)
    assert_close(gs[1], 2 * np.sum(xs, axis=0)[off:off + sizes[r]])


@check("indexed_slices_allgather_and_sparse_as_dense")
def _():
    s = tf.IndexedSlices(tf.constant([[1.0, 2.0]]) * (r + 1), tf.constant([r], tf.int64),
                         dense_shape=tf.constant([n, 2], tf.int64))
    y = hvd.allreduce(s, op=hvd.Average)
    assert isinstance(y, tf.IndexedSlices)
    dense = tf.convert_to_tensor(y).numpy()
    expect = np.array([[1.0, 2.0]]) * (np.arange(n)[:, None] + 1) / n
    assert_close(dense, expect)
    d = hvd.allreduce(s, op=hvd.Sum, sparse_as_dense=True)
    assert isinstance(d, tf.Tensor)
    assert_close(d, expect * n)
    # scale factors scale the values (Horovod raises NotImplementedError here)
    scaled = hvd.allreduce(s, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    assert_close(tf.convert_to_tensor(scaled).numpy(), expect * n * 1.5)


@check("indexed_slices_follow_horovods_rules")
def _():
    """Averaged integer slices become floating (true division); ops other than Average and
    Sum raise NotImplementedError (Horovod's test_horovod_*allreduce*_indexed_slices_*)."""
    for dtype, want in ((tf.uint8, tf.float32), (tf.int8, tf.float32), (tf.int32, tf.float64),
                        (tf.int64, tf.float64), (tf.float16, tf.float16)):
        s = tf.IndexedSlices(tf.ones([2, 3], dtype) * (r + 1), tf.constant([r, r + 1]))
        for y in (hvd.allreduce(s, op=hvd.Average),
                  hvd.grouped_allreduce([s, tf.ones([2], dtype)], op=hvd.Average)[0]):
            assert y.values.dtype == want, (dtype.name, y.values.dtype.name)
            dense = tf.math.unsorted_segment_sum(tf.cast(y.values, tf.float64), y.indices, n + 1)
            expect = np.zeros((n + 1, 3))
            for k in range(n):
                expect[k:k + 2] += (k + 1) / n
            assert_close(dense, expect, rtol=1e-3, msg=dtype.name)
        summed = hvd.allreduce(s, op=hvd.Sum)
        assert summed.values.dtype == dtype, (dtype.name, summed.values.dtype.name)
    dense_int = hvd.grouped_allreduce([s, tf.constant([2 * r + 1], tf.int32)], op=hvd.Average)[1]
    assert dense_int.dtype == tf.int32 and int(dense_int[0]) == n  # dense: the dtype is kept
    for op in (hvd.Min, hvd.Max, hvd.Product, hvd.Adasum):
        for call in (lambda: hvd.allreduce(s, op=op), lambda: hvd.grouped_allreduce([s], op=op)):
            try:
                call()
            except NotImplementedError as e:
                assert "sparse_as_dense=True" in str(e), e
            else:
                raise AssertionError(f"IndexedSlices with {op} must raise NotImplementedError")


@check("compression_fp16_and_bf16_roundtrip")
def _():
    x = tf.constant(x_of(r) / 7.0)
    for comp, tol in ((hvd.Compression.fp16, 1e-3), (hvd.Compression.bf16, 1e-2)):
        y = hvd.allreduce(x, compression=comp)
        assert y.dtype == tf.float32
        assert_close(y, np.mean(ALL, axis=0) / 7.0, rtol=tol)


@check("rank_size_ops_barrier_join")
def _():
    assert int(hvd.rank_op()) == r and int(hvd.size_op()) == n
    assert int(hvd.local_rank_op()) == hvd.local_rank()
    assert int(hvd.local_size_op()) == hvd.local_size()
    hvd.barrier()
    tf.function(lambda: hvd.barrier())()
    last = hvd.join()
    assert 0 <= int(last) < n


@check("string_tensor_is_rejected_with_clear_error")
def _():
    try:
        hvd.allreduce(tf.constant(["a", "b"]))
    except TypeError as e:
        assert "dtype string" in str(e) and "broadcast_object" in str(e), e
    else:
        raise AssertionError("no error")
    try:
        hvd.allreduce(tf.constant([1 + 2j]))
    except TypeError as e:
        assert "tf.cast" in str(e), e
    else:
        raise AssertionError("no error")


@check("shape_mismatch_across_ranks_raises_on_every_rank")
def _():
    if n == 1:
        return
    def eager(t):
        return hvd.allreduce(t)

    # eager: Horovod's class; in a graph TensorFlow turns any error raised in a Python
    # function op into UnknownError, whose message keeps ours and the class we raised
    for run, error in ((eager, tf.errors.FailedPreconditionError),
                       (tf.function(eager), tf.errors.OpError)):
        try:
            run(tf.zeros([r + 1, 2]))
        except error as e:
            assert "FailedPrecondition" in type(e).__name__ + str(e), e
            assert "shape: rank 0 has (1, 2), rank 1 has (2, 2)" in str(e), e
            if run is eager:  # raised from the function called: no engine frames, no chain
                import traceback
                files = [f.filename for f in traceback.extract_tb(e.__traceback__)]
                assert files[-1].endswith("hvdlike/base/tracebacks.py"), files
                assert not any("/hvdlike/engine/" in f for f in files), files
                assert e.__cause__ is None, e.__cause__
        else:
            raise AssertionError("no error")
    # the same number of elements in another shape, among tensors that cross a graph packed
    packed = tf.function(lambda a, b: hvd.grouped_allreduce([a, b]))
    try:
        packed(tf.zeros([2, 3] if r == 0 else [3, 2]), tf.zeros([4]))
    except tf.errors.OpError as e:
        assert "FailedPrecondition" in str(e), e
        assert "rank 0 has ((2, 3), (4,)), rank 1 has ((3, 2), (4,))" in str(e), e
    else:
        raise AssertionError("no error")
    hvd.barrier()


@check("jit_compile_gives_clear_error")
def _():
    @tf.function(jit_compile=True)
    def f(x):
        return hvd.allreduce(x)
    try:
        f(tf.ones([2]))
    except RuntimeError as e:
        assert "between compiled parts" in str(e) and "jit_compile=False" in str(e), e
    else:
        raise AssertionError("no error")


@check("broadcast_variables_object_and_allgather_object")
def _():
    vs = [tf.Variable(x_of(r)), tf.Variable(tf.constant([r], tf.int64)),
          tf.Variable(np.float64(r))]
    hvd.broadcast_variables(vs, root_rank=n - 1)
    assert_close(vs[0], x_of(n - 1))
    assert vs[1].numpy().tolist() == [n - 1] and float(vs[2].numpy()) == n - 1
    vs2 = [tf.Variable(x_of(r))]
    tf.function(lambda: hvd.broadcast_variables(vs2, 0))()
    assert_close(vs2[0], x_of(0))
    obj = hvd.broadcast_object({"rank": r, "t": tf.constant([r])}, root_rank=0)
    assert obj["rank"] == 0 and obj["t"].tolist() == [0]
    assert hvd.allgather_object(r * 10) == [k * 10 for k in range(n)]




@check("independent_collectives_in_v1_graph_run_in_any_order")
def _():
    """A tf.compat.v1 graph of independent unnamed collectives whose inputs are delayed in a
    rank-dependent order, so that each rank runs them in another order: they pair by their
    graph op names and every result is right."""
    import time
    k = 4
    graph = tf.Graph()
    with graph.as_default():
        outs = []
        for i in range(k):
            delay = (i if r % 2 == 0 else k - 1 - i) * 0.05

            def late(x, delay=delay):
                time.sleep(delay)
                return x

            x = tf.numpy_function(late, [tf.constant(x_of(r, shape=(i + 1,)))], tf.float32)
            x.set_shape((i + 1,))
            outs.append(hvd.allreduce(x, op=hvd.Sum))
        outs.append(hvd.allgather(tf.constant(x_of(r, shape=(1, 2)))))
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=k + 2)
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        got = sess.run(outs)
    for i in range(k):
        assert_close(got[i], np.sum([x_of(q, shape=(i + 1,)) for q in range(n)], axis=0))
    assert_close(got[k], np.concatenate([x_of(q, shape=(1, 2)) for q in range(n)]))


@check("named_collectives_built_in_rank_dependent_order_in_tf_function")
def _():
    """A tf.function in which each rank builds its named collectives in another order (rank 0
    a, b, c; rank 1 c, b, a): automatic control dependencies run them in that order, and
    they still pair by name with the right results (no deadlock, no mismatch)."""
    shapes = {"a": (3,), "b": (2, 2), "c": (5,)}
    order = sorted(shapes) if r % 2 == 0 else sorted(shapes, reverse=True)

    @tf.function
    def step():
        out = {}
        for key in order:
            x = tf.constant(x_of(r, shape=shapes[key]))
            if key == "b":
                out[key] = hvd.allgather(x, name="order/" + key)
            else:
                out[key] = hvd.allreduce(x, op=hvd.Sum, name="order/" + key)
        return out

    for _ in range(2):  # the second call is negotiated from the response cache
        got = step()
        for key in ("a", "c"):
            assert_close(got[key], np.sum([x_of(q, shape=shapes[key]) for q in range(n)], axis=0))
        assert_close(got["b"], np.concatenate([x_of(q, shape=shapes["b"]) for q in range(n)]))



@check("hvdlike_runs_as_written_inside_autographed_functions")
def _():
    """A user's tf.function is converted by AutoGraph, and so, unless told otherwise, is every
    function it calls, hvdlike's included: the Python that hvdlike's graph ops run at each
    step (the submits, the waits) would be AutoGraph's rewrite of it, about twice as slow.
    Records where every request handed to the engine comes from, in a step that uses the
    collectives, a DistributedGradientTape and a DistributedOptimizer, and asserts that no
    frame is AutoGraph-generated code (and that the results are right)."""
    import traceback
    from hvdlike.engine.engine import Engine
    from hvdlike.tensorflow import compat
    keras = compat.keras()
    stacks = []
    originals = {name: getattr(Engine, name) for name in ("submit", "call")}

    def recording(original):
        def method(self, *args, **kwargs):
            stacks.append([f.filename for f in traceback.extract_stack()])
            return original(self, *args, **kwargs)
        return method

    w, v = tf.Variable(np.ones(3, np.float32)), tf.Variable(np.zeros(3, np.float32))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.5))

    @tf.function
    def step(x):
        s = hvd.allreduce(x, op=hvd.Sum, name="autograph/sum")
        g = hvd.grouped_allreduce([x, 2.0 * x], name="autograph/grouped")
        with tf.GradientTape(persistent=True) as tape:
            loss = tf.reduce_sum(w * x)
            other = tf.reduce_sum(v * x)
        (grad,) = hvd.DistributedGradientTape(tape).gradient(loss, [w])
        opt.apply_gradients([(tape.gradient(other, v), v)])  # the optimizer reduces
        return s, g, grad, hvd.allgather(x[:1], name="autograph/gather")

    for name, original in originals.items():
        setattr(Engine, name, recording(original))
    try:
        x = tf.constant(x_of(r, shape=(3,)))
        s, g, grad, gathered = step(x)
    finally:
        for name, original in originals.items():
            setattr(Engine, name, original)
    xs = [x_of(q, shape=(3,)) for q in range(n)]
    assert_close(s, np.sum(xs, axis=0))
    assert_close(g[1], 2 * np.mean(xs, axis=0))
    assert_close(grad, np.mean(xs, axis=0))
    assert_close(v, -0.5 * np.mean(xs, axis=0))
    assert_close(gathered, [xq[0] for xq in xs])
    assert stacks, "no request reached the engine"
    generated = sorted({f for stack in stacks for f in stack if "__autograph_generated" in f})
    assert not generated, f"AutoGraph-generated code on the step's path: {generated[:3]}"


@check("broadcast_gradient_on_a_process_set_goes_to_the_world_root")
def _():
    # the set holds the upper ranks, so a set rank differs from its world rank
    members = list(range(n // 2, n))  # the whole world at np=1
    ps = hvd.add_process_set(members) if n > 1 else hvd.global_process_set
    root = members[-1]
    if r in members:
        x = tf.constant(np.ones((2, 2), np.float32))
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(hvd.broadcast(x, root_rank=root, process_set=ps) * float(r + 1))
        g = tape.gradient(loss, x)
        expect = sum(q + 1 for q in members) / len(members) if r == root else 0.0
        assert_close(g, np.full((2, 2), expect, np.float32))
    if n > 1:
        hvd.remove_process_set(ps)



# Horovod's gradient tests (test_horovod_{allgather,broadcast,grouped_allgather}_grad_cpu):
# the same cases eagerly, in a tf.function and in a tf.compat.v1 graph; these used to hang
SIZES = [3, 2, 7, 4, 6, 8, 10]


def _grads(build, mode):
    """``build(x)`` -> (outputs, their upstream gradients, inputs); their gradient, in
    ``mode``: "eager" (GradientTape), "function" (tf.function) or "graph" (v1 gradients)."""
    if mode == "graph":
        with tf.Graph().as_default() as graph:
            outs, ys, xs = build()
            grads = tf.compat.v1.gradients(outs, xs, ys)
        with tf.compat.v1.Session(graph=graph) as sess:
            return sess.run(grads)

    def run():
        with tf.GradientTape() as tape:
            outs, ys, xs = build(tape)
        return tape.gradient(outs, xs, ys)
    got = tf.function(run)() if mode == "function" else run()
    return [g.numpy() for g in got]


def _watched(value, tape):
    x = tf.constant(value)
    if tape is not None:
        tape.watch(x)
    return x


@check("horovod_gradient_cases_eager_function_and_v1_graph")
def _():
    sizes = SIZES[:n] if n <= len(SIZES) else [2] * n
    for mode in ("eager", "function", "graph"):
        for dtype, dim in ((np.float32, 1), (np.float64, 2), (np.float32, 3)):
            tail = [17] * (dim - 1)

            def allgather_case(tape=None):
                x = _watched(np.full([sizes[r]] + tail, r, dtype), tape)
                ys = tf.concat([tf.ones([s] + tail, dtype) * q for q, s in enumerate(sizes)], 0)
                return [hvd.allgather(x)], [ys], [x]
            (g,) = _grads(allgather_case, mode)
            assert_close(g, np.full([sizes[r]] + tail, r, dtype), msg=f"allgather {mode} {dim}")

            for root in range(n):
                def broadcast_case(tape=None, root=root):
                    x = _watched(np.full([5] * dim, r, dtype), tape)
                    return [hvd.broadcast(x, root)], [tf.ones([5] * dim, dtype)], [x]
                (g,) = _grads(broadcast_case, mode)
                assert_close(g, np.full([5] * dim, 1.0 if r == root else 0.0, dtype),
                             msg=f"broadcast {mode} root {root}")

            for op, times in ((hvd.Sum, n), (hvd.Average, 1)):
                def reducescatter_case(tape=None, op=op):  # Horovod's test_*reducescatter_grad
                    x = _watched(np.full([n * 4] + tail, r, dtype), tape)
                    return [hvd.reducescatter(x, op=op)], [tf.ones([4] + tail, dtype)], [x]
                (g,) = _grads(reducescatter_case, mode)
                assert_close(g, np.full([n * 4] + tail, times, dtype),
                             msg=f"reducescatter {op} {mode} {dim}")

        def grouped_scatter_case(tape=None):
            xs = [_watched(np.full([n * 2, 3], r, np.float32), tape),
                  _watched(np.full([n], r, np.float64), tape)]
            outs = hvd.grouped_reducescatter(xs, op=hvd.Sum)
            return outs, [tf.ones_like(o) * (r + 1) for o in outs], xs
        for g, shape in zip(_grads(grouped_scatter_case, mode), ([n * 2, 3], [n])):
            rows = np.repeat(np.arange(1, n + 1), shape[0] // n)  # rank k's block: k + 1
            rows = rows.reshape([-1] + [1] * (len(shape) - 1))
            assert_close(g, n * np.broadcast_to(rows, shape), msg=f"grouped_reducescatter {mode}")

        def grouped_case(tape=None):
            xs = [_watched(np.full([sizes[r], 3], r, np.float32), tape),
                  _watched(np.full([sizes[r]], r, np.float64), tape)]
            outs = hvd.grouped_allgather(xs)
            return outs, [tf.ones_like(o) * 2 for o in outs], xs
        for g, shape in zip(_grads(grouped_case, mode), ([sizes[r], 3], [sizes[r]])):
            assert_close(g, np.full(shape, 2.0), msg=f"grouped_allgather {mode}")

    with tf.Graph().as_default():  # graph mode: Horovod's test_broadcast_object
        expected = {"hello": 123, 0: [1, 2]}
        got = hvd.broadcast_object(expected if r == 0 else {}, root_rank=0)
    assert got == expected, got


@check("horovod_prescale_postscale_and_dtypes")
def _():
    """Horovod's test_horovod_allreduce_cpu_{prescale,postscale} (its expected values, its
    thresholds) and the dtypes its allgather and broadcast tests communicate."""
    int_types = (tf.int32, tf.int64)
    for dtype in (tf.int32, tf.int64, tf.float16, tf.float32):
        wide = tf.float32 if dtype == tf.float16 else tf.float64 if dtype in int_types else dtype
        threshold = 0 if n <= 3 or dtype in int_types else 1e-4
        for dim in (1, 2, 3):
            np.random.seed(1234)
            factor = np.random.uniform()
            tf.random.set_seed(1234)
            tensor = tf.random.uniform([17] * dim, -100, 100, dtype=dtype)
            f = tf.convert_to_tensor(factor, wide)
            pre = hvd.allreduce(tensor, average=False, prescale_factor=factor)
            want = tf.cast(f * tf.cast(tensor, wide), dtype) * n
            diff = float(tf.reduce_max(tf.abs(tf.cast(pre, tf.float64) - tf.cast(want, tf.float64))))
            assert diff <= threshold, (dtype.name, dim, "prescale", diff)
            post = hvd.allreduce(tensor, average=False, postscale_factor=factor)
            want = tf.cast(f * tf.cast(tensor * n, wide), dtype)
            diff = float(tf.reduce_max(tf.abs(tf.cast(post, tf.float64) - tf.cast(want, tf.float64))))
            assert diff <= threshold, (dtype.name, dim, "postscale", diff)
    for dtype in (tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16,
                  tf.float32, tf.float64, tf.bool, tf.uint32, tf.uint64):
        for dim in (1, 2, 3):
            tensor = tf.ones([17] * dim) * r
            tensor = tf.cast(tensor % 2 if dtype == tf.bool else tensor, dtype)
            gathered = hvd.allgather(tensor)
            assert gathered.shape.as_list() == [17 * n] + [17] * (dim - 1)
            for q in range(n):
                value = q % 2 if dtype == tf.bool else q
                block = tf.cast(gathered[q * 17:(q + 1) * 17], tf.int32)
                assert bool(tf.reduce_all(tf.equal(block, value))), (dtype.name, dim, q)
            root = n - 1
            got = hvd.broadcast(tensor, root)
            value = root % 2 if dtype == tf.bool else root
            assert bool(tf.reduce_all(tf.equal(tf.cast(got, tf.int32), value))), (dtype.name, dim)
        if dtype != tf.bool:
            summed = hvd.allreduce(tf.cast(tf.ones([4]) * (r + 1), dtype), op=hvd.Sum)
            assert tf.cast(summed, tf.int64).numpy().tolist() == [n * (n + 1) // 2] * 4, dtype


@check("horovod_port_names")
def _():
    """Names a Horovod port uses: *_built, process-set ops, broadcast_, broadcast_object_fn,
    groups=<int>, register_local_source / PartialDistributedGradientTape /
    PartialDistributedOptimizer (local layers), BroadcastGlobalVariablesCallback's
    local_variables, DistributedOptimizer's use_locking."""
    import hvdlike.tensorflow.keras as hvdk
    from hvdlike.tensorflow import compat
    keras = compat.keras()
    assert not hvd.ccl_built() and not hvd.ddl_built() and not hvd.rocm_built()
    assert not hvd.sycl_built() and hvd.gpu_available("tensorflow") == hvd.cuda_built()
    assert hvd.remove_process_set(hvd.global_process_set) is False  # Horovod's answer
    single = hvd.add_process_set([0]) if n > 1 else hvd.global_process_set
    assert int(hvd.size_op(process_set_id=single.process_set_id)) == 1
    assert int(hvd.process_set_included_op(process_set_id=single.process_set_id)) == int(r == 0)
    assert int(hvd.rank_op(process_set_id=single.process_set_id)) == (0 if r == 0 else -1)
    assert int(hvd.size_op()) == n and int(hvd.process_set_included_op()) == 1
    if n > 1:
        hvd.remove_process_set(single)
    try:
        hvd.size_op(process_set_id=99)
        raise AssertionError("an unknown process set id must raise")
    except ValueError as e:
        assert "no process set has id 99" in str(e)

    v = [tf.Variable(np.full(3, r, np.float32)), tf.Variable([r], dtype=tf.int64)]
    out = hvd.broadcast_(v, root_rank=n - 1)
    assert out[0] is v[0] and v[0].numpy().tolist() == [n - 1] * 3 and int(v[1][0]) == n - 1
    import hvdlike.tensorflow.util
    assert hvd._executing_eagerly() and hvd.util._executing_eagerly()
    assert hvd.util is hvdlike.tensorflow.util
    with tf.Graph().as_default() as graph:  # Horovod's test_horovod_broadcast_inplace_cpu
        assert not hvd._executing_eagerly()
        tf1 = [tf.compat.v1.Variable(np.full(3, r, np.uint8), use_resource=False),
               tf.compat.v1.Variable(np.full(2, r, np.float32), use_resource=True)]
        assert tf1[0].dtype == tf.uint8._as_ref
        outs = hvd.broadcast_(tf1, root_rank=n - 1)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert sess.run(tf1[0]).tolist() == [r] * 3  # nothing runs before the ops do
            got = sess.run(outs)
            assert [g.tolist() for g in got] == [[n - 1] * 3, [n - 1] * 2], got
            assert [x.tolist() for x in sess.run(tf1)] == [[n - 1] * 3, [n - 1] * 2]
    assert hvd.broadcast_object_fn(root_rank=0)({"r": r}) == {"r": 0}

    # local layers: their gradients are this rank's own, divided by the size (Horovod's rule)
    keras.utils.set_random_seed(1)
    shared, local = keras.layers.Dense(2), keras.layers.Dense(1)
    x = tf.constant(np.full((4, 3), r + 1, np.float32))

    def loss_fn():
        return tf.reduce_sum(local(shared(x)) ** 2)

    loss_fn()
    variables = shared.trainable_weights + local.trainable_weights
    with tf.GradientTape() as plain:
        loss = loss_fn()
    own = plain.gradient(loss, variables)
    with tf.GradientTape(persistent=True) as tape:
        loss = loss_fn()
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=local, groups=2)
    got = tape.gradient(loss, variables)
    mean = [hvd.allgather(tf.expand_dims(g, 0)).numpy().mean(axis=0) for g in own]
    for g, m in zip(got[:2], mean[:2]):
        assert_close(g, m, rtol=1e-5)
    for g, o in zip(got[2:], own[2:]):
        assert_close(g, o.numpy() / n, rtol=1e-6)
    local_pairs, global_pairs = tape.get_local_and_global_gradients(loss, variables)
    assert len(local_pairs) == 2 and len(global_pairs) == 2
    for (v, g), i in zip(local_pairs + global_pairs, (2, 3, 0, 1)):  # local layer: 2 and 3
        assert v is variables[i], (v.name, variables[i].name)
        assert_close(g, got[i], rtol=1e-6)

    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[local])
    before = [w.numpy() for w in variables]
    opt.apply_gradients(zip(own, variables))
    for w, b, g, m in zip(variables[:2], before[:2], own[:2], mean[:2]):
        assert_close(w, b - m, rtol=1e-5)
    for w, b, g in zip(variables[2:], before[2:], own[2:]):
        assert_close(w, b - g.numpy() / n, rtol=1e-5)
    hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), use_locking=True, groups=2)

    # BroadcastGlobalVariablesCallback leaves local_variables alone
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    for w in model.weights:
        w.assign(tf.fill(w.shape, float(r)))
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    keep = model.layers[1].trainable_weights
    model.fit(np.zeros((2, 3), np.float32), np.zeros((2, 1), np.float32), epochs=1, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(
                  0, local_variables=keep)])
    assert float(model.layers[0].kernel[0, 0]) == 0.0
    assert float(model.layers[1].kernel[0, 0]) == float(r)


@check("horovod_mpi_ops_module")
def _():
    """Scripts (custom compressors, above all) that import from Horovod's mpi_ops module."""
    from hvdlike.tensorflow import mpi_ops
    from hvdlike.tensorflow.mpi_ops import _allreduce, allgather, rank, size, Sum, Average
    assert (rank(), size()) == (r, n)
    assert mpi_ops.broadcast is hvd.broadcast is hvd.mpi_ops.broadcast
    x = tf.constant(x_of(r))
    assert_close(_allreduce(x), np.sum(ALL, axis=0))  # Horovod's raw op sums
    assert_close(_allreduce(x, op=Average, name="mpi_ops.avg"), np.mean(ALL, axis=0))
    assert_close(tf.function(lambda t: _allreduce(t, op=Sum, postscale_factor=2.0))(x),
                 2 * np.sum(ALL, axis=0))
    assert allgather(tf.constant([r])).numpy().tolist() == list(range(n))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(_allreduce(x) * (r + 1))
    # the gradient of a Sum all-reduce is the Sum all-reduce of the incoming gradients
    assert_close(tape.gradient(y, x), np.full((2, 3), n * (n + 1) / 2))

close()
