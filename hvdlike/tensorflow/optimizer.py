"""DistributedOptimizer for Keras 3 optimizers (and tf_keras with TF_USE_LEGACY_KERAS=1).

``DistributedOptimizer(opt)`` returns a new optimizer of a subclass of ``type(opt)``
built from ``opt.get_config()``; the subclass reduces the gradients across ranks
(one fused allreduce per step) before the wrapped class applies them, so clipping,
weight decay, loss scaling and EMA all see the averaged gradient.
"""
import functools
from typing import Any, Callable, Dict, Optional, Sequence

import tensorflow as tf

import hvdlike as _core
from hvdlike import Average, Min
from hvdlike.tensorflow import compat, control_ops, ops, optimizer_v1
from hvdlike.tensorflow.compression import Compression
from hvdlike.tensorflow.gradients import GradientReducer, backward_passes, variable_key


class _AccumulationState:
    """Local gradient accumulators (deliberately not tracked by Keras checkpoints)."""

    def __init__(self):
        self.accumulators = None
        self.counter = None


class _DistributedMixin:
    """Mixed into the user's optimizer class by :func:`DistributedOptimizer`."""

    _hvd_settings = {}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._hvd_configure(**type(self)._hvd_settings)

    def _hvd_configure(self, compression=Compression.none, sparse_as_dense=False,
                       gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                       average_aggregated_gradients=False, num_groups=0, groups=None,
                       process_set=_core.global_process_set, scale_local_gradients=True,
                       name=None):
        bpps = backward_passes(backward_passes_per_step)
        reducer = GradientReducer(compression=compression, sparse_as_dense=sparse_as_dense,
                                  op=op, gradient_predivide_factor=gradient_predivide_factor,
                                  num_groups=num_groups, groups=groups,
                                  process_set=process_set, name=name,
                                  owner="DistributedOptimizer",
                                  scale_local_gradients=scale_local_gradients)
        object.__setattr__(self, "_hvd_reducer", reducer)
        object.__setattr__(self, "_hvd_bpps", bpps)
        object.__setattr__(self, "_hvd_average_aggregated", bool(average_aggregated_gradients))
        object.__setattr__(self, "_hvd_acc", _AccumulationState())
        object.__setattr__(self, "_hvd_reduced_for", None)  # see _LegacyMixin

    # -- reduction ---------------------------------------------------------------------
    def _hvd_variables(self, trainable_variables):
        if trainable_variables is not None:
            return list(trainable_variables)
        return list(getattr(self, "_trainable_variables", None) or []) or None

    def _hvd_reduce(self, grads, variables):
        return self._hvd_reducer.reduce(grads, variables)

    def register_local_var(self, var: Any) -> None:
        """Keep ``var``'s gradient local: not reduced over ranks (divided by the set size
        when ``scale_local_gradients``), as Horovod's ``register_local_var``."""
        self._hvd_reducer.register_local(var)

    def _hvd_accumulators(self, variables, grads):
        st = self._hvd_acc
        if st.accumulators is None:
            with tf.init_scope():
                st.accumulators = [
                    None if g is None else tf.Variable(
                        tf.zeros(v.shape, dtype=g.dtype), trainable=False,
                        name="hvd_accumulator")
                    for v, g in zip(variables, grads)]
                st.counter = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name="hvd_backward_passes")
        return st

    def _hvd_accumulate_then_apply(self, grads, variables, apply_fn):
        """Accumulate locally; every ``backward_passes_per_step`` calls, reduce and apply."""
        st = self._hvd_accumulators(variables, grads)
        for acc, g in zip(st.accumulators, grads):
            if acc is not None and g is not None:
                acc.assign_add(tf.convert_to_tensor(g))
        st.counter.assign_add(1)
        k = self._hvd_bpps

        def _apply():
            local = [None if acc is None else acc.read_value() for acc in st.accumulators]
            if self._hvd_average_aggregated:
                local = [None if g is None else g / tf.cast(k, g.dtype) for g in local]
            apply_fn(self._hvd_reduce(local, variables), variables)
            for acc in st.accumulators:
                if acc is not None:
                    acc.assign(tf.zeros_like(acc))
            st.counter.assign(0)
            return tf.constant(True)

        return tf.cond(st.counter >= k, _apply, lambda: tf.constant(False))


class _Keras3Mixin(_DistributedMixin):
    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if not grads:
            return super().apply(grads, trainable_variables)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
        variables = self._hvd_variables(trainable_variables)
        if all(g is None for g in grads):
            names = [getattr(v, "path", getattr(v, "name", "?")) for v in (variables or [])]
            raise ValueError(
                "hvdlike DistributedOptimizer: every gradient is None, so there is nothing "
                f"to reduce or apply (variables: {names[:5]}{'...' if len(names) > 5 else ''})."
                " Check that the loss depends on the trainable variables and that the "
                "gradient tape watched them.")
        parent_apply = super().apply
        if self._hvd_bpps == 1:
            result = parent_apply(self._hvd_reduce(grads, variables), trainable_variables)
        else:
            result = None
            self._hvd_accumulate_then_apply(
                grads, variables, lambda g, v: parent_apply(g, trainable_variables))
        control_ops.timeline_step_done(variables)
        return result


class _LegacyMixin(_DistributedMixin):
    """tf_keras (Keras 2) optimizers: gradients an optimizer computes itself
    (``compute_gradients``, and for ``optimizers.legacy`` classes ``get_gradients`` and
    ``_compute_gradients``) come back reduced, as in Horovod, and the next
    ``apply_gradients`` for those variables applies them as given; gradients from
    anywhere else (a plain ``tf.GradientTape``) are reduced in ``apply_gradients``."""

    def _hvd_reduce_computed(self, grads, variables):
        """Reduce gradients the optimizer computed and remember for which variables, so that
        ``apply_gradients`` does not reduce them again.  With ``backward_passes_per_step``
        > 1 they stay local: ``apply_gradients`` accumulates and reduces every k-th pass."""
        grads, variables = list(grads), list(variables)
        if self._hvd_bpps > 1 or all(g is None for g in grads):
            return grads
        reduced = self._hvd_reduce(grads, variables)
        object.__setattr__(self, "_hvd_reduced_for", {variable_key(v) for v in variables})
        return reduced

    def _hvd_reduced_pairs(self, grads_and_vars):
        grads_and_vars = list(grads_and_vars)
        variables = [v for _, v in grads_and_vars]
        return list(zip(self._hvd_reduce_computed([g for g, _ in grads_and_vars], variables),
                        variables))

    def _hvd_already_reduced(self, variables):
        """True once if the optimizer itself reduced these variables' gradients last."""
        marked = self._hvd_reduced_for
        object.__setattr__(self, "_hvd_reduced_for", None)
        return marked is not None and {variable_key(v) for v in variables} <= marked

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        if all(g is None for g in grads):
            raise ValueError("hvdlike DistributedOptimizer: every gradient is None; check "
                             "that the loss depends on the trainable variables.")
        parent = super().apply_gradients
        if self._hvd_already_reduced(variables):
            result = parent(grads_and_vars, *args, **kwargs)
        elif self._hvd_bpps == 1:
            result = parent(list(zip(self._hvd_reduce(grads, variables), variables)),
                            *args, **kwargs)
        else:
            result = self._hvd_accumulate_then_apply(
                grads, variables, lambda g, v: parent(list(zip(g, v)), *args, **kwargs))
        control_ops.timeline_step_done(variables)
        return result


class _TfKerasMixin(_LegacyMixin):
    """tf_keras.optimizers.Optimizer: ``compute_gradients`` (``minimize``, ``fit``) reduces."""

    def compute_gradients(self, loss, var_list, tape=None):
        return self._hvd_reduced_pairs(super().compute_gradients(loss, var_list, tape=tape))


class _OptimizerV2Mixin(_LegacyMixin):
    """tf_keras.optimizers.legacy: ``get_gradients`` and ``_compute_gradients`` reduce."""

    def get_gradients(self, loss, params):
        return self._hvd_reduce_computed(super().get_gradients(loss, params), params)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        return self._hvd_reduced_pairs(
            super()._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape))


_CLASS_CACHE = {}


def _distributed_class(base, settings):
    """A subclass of ``base`` that reduces gradients with ``settings``."""
    if not compat.use_legacy_keras():
        mixin = _Keras3Mixin
    else:
        mixin = _OptimizerV2Mixin if hasattr(base, "get_gradients") else _TfKerasMixin
    cls = type(base.__name__, (mixin, base), {"_hvd_settings": dict(settings)})
    cls.__module__ = base.__module__
    cls.__qualname__ = base.__qualname__
    return cls


def is_distributed_optimizer(optimizer: Any) -> bool:
    return isinstance(optimizer, _DistributedMixin) or optimizer_v1.is_distributed_v1(optimizer)


def _check_optimizer(optimizer):
    bases = compat.optimizer_base_classes()
    if not isinstance(optimizer, bases):
        kind = "tf_keras (TF_USE_LEGACY_KERAS=1)" if compat.use_legacy_keras() else "Keras 3"
        other = ""
        if isinstance(optimizer, tf.Module) or "keras" in type(optimizer).__module__:
            other = (" If this is an optimizer from the other Keras flavour, set or unset "
                     "TF_USE_LEGACY_KERAS=1 before importing TensorFlow so both agree.")
        raise TypeError(
            f"hvdlike DistributedOptimizer expects a {kind} optimizer (an instance of "
            f"{', '.join(b.__module__ + '.' + b.__name__ for b in bases)}), got "
            f"{type(optimizer).__module__}.{type(optimizer).__name__}. Create it with "
            "keras.optimizers (e.g. keras.optimizers.SGD(0.01)); a tf.compat.v1.train "
            "optimizer works too; for custom training loops with other optimizers use "
            f"hvdlike.tensorflow.DistributedGradientTape.{other}")


def DistributedOptimizer(optimizer: Any, name: Optional[str] = None, device_dense: str = "",
                         device_sparse: str = "", compression: Any = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: Any = Average, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None,
                         process_set: _core.ProcessSet = _core.global_process_set,
                         scale_local_gradients: bool = True, use_locking: bool = False) -> Any:
    """Wrap a Keras optimizer so that every step applies gradients reduced over ranks.

    Every rank wraps an optimizer of the same class and config with the same settings.
    Returns a new optimizer (subclass of ``type(optimizer)``, same config); the
    original is not modified.  Gradients of one step go through one fused allreduce
    (``num_groups`` > 1 or ``groups`` split it into several).  ``op``: Average (default),
    Sum or Adasum (the gradients combined by Horovod's adaptive summation; 2^k ranks, and
    the learning rate is not scaled by the number of ranks).  ``compression``:
    Compression.none / fp16 / bf16 on the wire.
    ``backward_passes_per_step`` k: gradients are summed locally for k calls, then
    reduced once and applied (divided by k first if ``average_aggregated_gradients``);
    ``optimizer.iterations`` counts applied updates.  Mixed precision: a
    ``LossScaleOptimizer`` may sit inside (``DistributedOptimizer(LossScaleOptimizer(opt))``)
    or outside (``LossScaleOptimizer(DistributedOptimizer(opt))``, which is also what
    ``model.compile`` builds under a ``mixed_float16`` policy); either way every rank makes
    the same skip-or-apply decision.  ``groups`` may also be a number of groups, as in
    Horovod.  ``optimizer.register_local_var(v)`` keeps ``v``'s gradient local (divided by
    the set size when ``scale_local_gradients``).  ``device_*`` are accepted for Horovod
    compatibility and have no effect.

    A ``tf.compat.v1.train.Optimizer`` (Horovod's TF1 API: ``minimize``, or
    ``compute_gradients`` and ``apply_gradients``, in a graph or eagerly) is wrapped too:
    its ``compute_gradients`` returns the reduced gradients; ``use_locking`` goes to the
    wrapper; with ``backward_passes_per_step`` k > 1 it sums gradients locally and applies
    them reduced on every k-th pass (``global_step`` still counts every pass).  With
    ``op=Adasum`` each rank applies its own gradients and every k-th pass the variables'
    changes since the last such pass are combined by Adasum, as in Horovod's TF1 optimizer.
    See ``BroadcastGlobalVariablesHook``.
    """
    if is_distributed_optimizer(optimizer):
        raise ValueError("hvdlike DistributedOptimizer: this optimizer is already distributed;"
                         " wrap the original optimizer only once.")
    if optimizer_v1.is_v1_optimizer(optimizer):
        return optimizer_v1.distributed_v1(
            optimizer, use_locking, backward_passes_per_step, average_aggregated_gradients,
            compression=compression,
            sparse_as_dense=sparse_as_dense, op=op,
            gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
            groups=groups, process_set=process_set, name=name,
            scale_local_gradients=scale_local_gradients)
    _check_optimizer(optimizer)
    if getattr(optimizer, "built", False) and getattr(optimizer, "variables", None):
        raise ValueError(
            "hvdlike DistributedOptimizer: the optimizer already has state (it was built or "
            "used). Wrap a fresh optimizer before compile/first step, or restore the model "
            "with hvdlike.keras.load_model, which re-creates the wrapped optimizer with its "
            "state.")
    settings = dict(compression=compression, sparse_as_dense=sparse_as_dense,
                    gradient_predivide_factor=gradient_predivide_factor, op=op,
                    backward_passes_per_step=backward_passes_per_step,
                    average_aggregated_gradients=average_aggregated_gradients,
                    num_groups=num_groups, groups=groups, process_set=process_set,
                    scale_local_gradients=scale_local_gradients, name=name)
    # Validate settings once, with a clear error, before building the class.
    GradientReducer(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                    gradient_predivide_factor=gradient_predivide_factor,
                    num_groups=num_groups, groups=groups, process_set=process_set)
    cls = _distributed_class(type(optimizer), settings)
    return cls.from_config(optimizer.get_config())


def _all_finite(finite: Any, inner: Any) -> Any:
    """The AND of ``finite`` over the ranks of ``inner``'s process set (a rank outside it
    keeps its own verdict, as it keeps its own gradients)."""
    ps = inner._hvd_reducer.process_set
    if not ps.included():
        return finite
    votes = ops.allreduce(tf.cast(finite, tf.int32), op=Min,
                          name="hvdlike.loss_scale.all_finite", process_set=ps)
    return tf.equal(votes, 1)


def _agree_on_loss_scale_decisions():
    """Make ``LossScaleOptimizer(DistributedOptimizer(opt))`` decide on every rank alike.

    A LossScaleOptimizer checks the gradients it is given for inf/NaN and only then calls
    the inner optimizer, whose apply all-reduces. If those are a rank's own gradients and one
    rank overflowed while another did not, one would reduce and the other skip: a hang, or
    steps silently paired with the wrong partner. Here, when the inner optimizer is
    distributed, the finite verdict becomes the AND over its ranks (as if the check had seen
    the reduced gradients, where one rank's inf spreads to all). Installed once; other
    LossScaleOptimizers are unaffected.
    """
    if compat.is_keras3():
        _agree_in_keras3()
    else:
        _agree_in_tf_keras()


def _agree_in_keras3():
    """Keras 3: always (its optimizers reduce in apply): the LSO's check_finite."""
    lso_cls = compat.loss_scale_optimizer_class()
    local_check = lso_cls.check_finite
    if getattr(local_check, "_hvdlike_agrees", False):
        return

    def check_finite(self, grads):
        finite = local_check(self, grads)
        inner = getattr(self, "inner_optimizer", None)
        return _all_finite(finite, inner) if is_distributed_optimizer(inner) else finite

    check_finite._hvdlike_agrees = True
    lso_cls.check_finite = check_finite


def _agree_in_tf_keras():
    """tf_keras: unless the inner optimizer's compute_gradients has just reduced them (with
    backward_passes_per_step > 1, or for gradients from a plain tape, it has not). The LSO's
    apply_gradients tells its dynamic loss scale state which inner optimizer to agree over;
    the state's update adds one more "gradient", NaN unless every rank's are finite."""
    module = compat.tf_keras_loss_scale_module()
    state_cls = None if module is None else module._DynamicLossScaleState
    if state_cls is None or getattr(state_cls.update, "_hvdlike_agrees", False):
        return
    local_update = state_cls.update

    def update(self, grads):
        inner = getattr(self, "_hvdlike_inner", None)
        if inner is not None:
            grads = tf.nest.flatten(grads)
            agreed = _all_finite(module._is_all_finite(grads), inner)
            grads = grads + [tf.where(agreed, 0.0, float("nan"))]
        return local_update(self, grads)

    update._hvdlike_agrees = True
    state_cls.update = update

    def agreeing(local_apply):
        def apply_gradients(self, *args, **kwargs):
            inner = getattr(self, "inner_optimizer", None)
            state = getattr(self, "_loss_scale", None)
            if isinstance(state, state_cls):
                unreduced = isinstance(inner, _LegacyMixin) and inner._hvd_reduced_for is None
                object.__setattr__(state, "_hvdlike_inner", inner if unreduced else None)
            return local_apply(self, *args, **kwargs)
        return apply_gradients

    for cls in (module.LossScaleOptimizer, module.LossScaleOptimizerV3):
        cls.apply_gradients = agreeing(cls.apply_gradients)


_agree_on_loss_scale_decisions()


def _wraps_a_distributed_optimizer(optimizer: Any) -> bool:
    """True for a distributed optimizer, also inside LossScaleOptimizers."""
    while optimizer is not None:
        if is_distributed_optimizer(optimizer):
            return True
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return False


def _auto_jit_off_when_distributed(local_resolve: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """Keras 3's resolution of ``jit_compile="auto"``, off for a model whose optimizer is
    distributed (Keras itself resolves "auto" to off under tf.distribute); else Keras's."""
    def _resolve_auto_jit_compile(self):
        if _wraps_a_distributed_optimizer(getattr(self, "optimizer", None)):
            return False
        return local_resolve(self)

    _resolve_auto_jit_compile._hvdlike_resolves = True
    return _resolve_auto_jit_compile


def _no_auto_xla_with_distributed_optimizers():
    """Keras 3 resolves ``compile(jit_compile="auto")`` to XLA on a machine with a GPU, and
    hvdlike's collectives cannot run inside XLA (the step would raise at trace time). With a
    DistributedOptimizer "auto" now means off, as Keras does under tf.distribute for the same
    reason; an explicit ``jit_compile=True`` still raises, saying what to do. Installed once."""
    owner = compat.keras3_model_method_owner("_resolve_auto_jit_compile")
    if owner is None or getattr(owner._resolve_auto_jit_compile, "_hvdlike_resolves", False):
        return
    owner._resolve_auto_jit_compile = _auto_jit_off_when_distributed(
        owner._resolve_auto_jit_compile)


_no_auto_xla_with_distributed_optimizers()


def _compile_taking_horovods_flag(compile_: Callable[..., Any]) -> Callable[..., Any]:
    """Keras 3's ``Model.compile``, which with a distributed optimizer also takes (and drops)
    ``experimental_run_tf_function``, the tf_keras argument Horovod's Keras examples pass."""
    @functools.wraps(compile_)
    def compile(self, *args, **kwargs):
        optimizer = kwargs.get("optimizer", args[0] if args else None)
        if "experimental_run_tf_function" in kwargs and \
                _wraps_a_distributed_optimizer(optimizer):
            kwargs.pop("experimental_run_tf_function")
        return compile_(self, *args, **kwargs)

    compile._hvdlike_takes_horovods_flag = True
    return compile


def _take_horovods_compile_flag():
    """Horovod's Keras examples call ``model.compile(..., experimental_run_tf_function=False)``
    so that tf_keras applies gradients through the optimizer. Keras 3 removed the argument
    (its ``fit`` always does that) and refuses it; with a DistributedOptimizer it is now
    accepted and ignored, so that such a script runs with only its import line changed.
    Without one, Keras's own TypeError stands. Installed once."""
    owner = compat.keras3_model_method_owner("compile")
    if owner is None or getattr(owner.compile, "_hvdlike_takes_horovods_flag", False):
        return
    owner.compile = _compile_taking_horovods_flag(owner.compile)


_take_horovods_compile_flag()


class _VariableList(list):
    """Keras 3's ``optimizer.variables``: the list, which may also be called (returning
    itself) as tf_keras's method ``optimizer.variables()`` is."""

    def __call__(self) -> "_VariableList":
        return self


def _learning_rate_alias() -> property:
    """tf_keras's ``lr``: ``learning_rate`` under the name Horovod's Keras examples use. A
    Keras 3 variable comes as the ``tf.Variable`` it holds, as in tf_keras, so that
    ``tf.keras.backend.set_value(opt.lr, x)`` / ``get_value`` work on it."""
    def lr(self):
        rate = self.learning_rate
        return rate.value if isinstance(rate, compat.keras().Variable) else rate

    def set_lr(self, value):
        self.learning_rate = value

    return property(lr, set_lr, doc="The learning rate (tf_keras's name, kept by hvdlike).")


def _keras2_names_on_keras3_optimizers():
    """Horovod's TF2 examples use two names of tf_keras optimizers that Keras 3 dropped:
    ``opt.variables()`` (a method there, a property holding a list in Keras 3: "'list'
    object is not callable") and ``opt.lr`` (the elastic Keras example resets the learning
    rate through it after a rank died). Keras 3's ``variables`` now returns a list that can
    also be called, and ``lr`` is ``learning_rate`` again, so such a script runs with only
    its import line changed; everything else is as Keras made it. Installed once."""
    if compat.use_legacy_keras():
        return
    base = next((c for c in compat.keras().optimizers.Optimizer.__mro__
                 if "variables" in vars(c)), None)
    if base is None:  # pragma: no cover - another Keras layout
        return
    classes, seen = [base], set()
    while classes:  # Keras's optimizers that define ``variables`` (LossScaleOptimizer does)
        cls = classes.pop()
        if cls in seen:
            continue
        seen.add(cls)
        classes.extend(cls.__subclasses__())
        prop = vars(cls).get("variables")
        if isinstance(prop, property) and not getattr(prop.fget, "_hvdlike_callable", False):
            cls.variables = _callable_variables(prop)
    if not hasattr(base, "lr"):
        base.lr = _learning_rate_alias()


def _callable_variables(prop: property) -> property:
    """Keras's ``variables`` property ``prop``, returning a list that may also be called."""
    keras_variables = prop.fget

    def variables(self):
        return _VariableList(keras_variables(self))

    variables._hvdlike_callable = True
    return property(variables, prop.fset, prop.fdel, prop.__doc__)


_keras2_names_on_keras3_optimizers()


def distributed_optimizer_classes(custom_optimizers: Optional[Sequence[type]] = None,
                                  **settings: Any) -> Dict[str, type]:
    """``{class name: distributed subclass}`` for load_model's custom_objects."""
    k = compat.keras()
    bases = compat.optimizer_base_classes()
    found = {}
    for attr in dir(k.optimizers):
        obj = getattr(k.optimizers, attr)
        if isinstance(obj, type) and issubclass(obj, bases) and obj not in bases:
            found[obj.__name__] = obj
    for obj in custom_optimizers or []:
        found[obj.__name__] = obj
    return {n: _distributed_class(c, settings) for n, c in found.items()}


def PartialDistributedOptimizer(optimizer: Any, name: Optional[str] = None,
                                device_dense: str = "", device_sparse: str = "",
                                compression: Any = Compression.none,
                                sparse_as_dense: bool = False,
                                gradient_predivide_factor: float = 1.0, op: Any = Average,
                                backward_passes_per_step: int = 1,
                                average_aggregated_gradients: bool = False, groups: Any = None,
                                process_set: _core.ProcessSet = _core.global_process_set,
                                local_layers: Any = None, scale_local_gradients: bool = True,
                                use_locking: bool = False) -> Any:
    """``DistributedOptimizer`` whose ``local_layers``' gradients stay local (not reduced;
    divided by the set size when ``scale_local_gradients``), as Horovod's."""
    from hvdlike.tensorflow.tape import _layer_variables

    local = _layer_variables(local_layers, "PartialDistributedOptimizer")
    opt = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression,
                               sparse_as_dense, gradient_predivide_factor, op,
                               backward_passes_per_step, average_aggregated_gradients,
                               groups=groups, process_set=process_set,
                               scale_local_gradients=scale_local_gradients)
    for v in local:
        opt.register_local_var(v)
    return opt
