"""The optimizer classes ``DistributedOptimizer`` builds: a mixin placed before the user's
optimizer class that reduces the gradients across ranks (after local accumulation over
``backward_passes_per_step`` calls) before the class applies them, one per Keras flavour and
the hook each one has (Keras 3's ``apply``, tf_keras's ``apply_gradients`` and
``compute_gradients``, ``OptimizerV2``'s ``get_gradients``)."""
from typing import Any

import tensorflow as tf

from hvdlike import Average, global_process_set
from hvdlike.tensorflow import compat, control_ops, optimizer_v1, xla_steps
from hvdlike.tensorflow.compression import Compression
from hvdlike.tensorflow.gradients import GradientReducer, backward_passes, variable_key


class GradientAggregation:
    """Local accumulation over ``backward_passes_per_step`` passes: the optimizer's
    ``_agg_helper``, as in Horovod. ``counter`` (a ``tf.Variable``, made on the first pass)
    counts the passes accumulated since the last update; the accumulators are deliberately
    not tracked by Keras checkpoints."""

    def __init__(self, backward_passes_per_step: int, average_aggregated_gradients: bool,
                 reducer: GradientReducer):
        self.backward_passes_per_step = backward_passes_per_step
        self.average_aggregated_gradients = average_aggregated_gradients
        self._reducer = reducer
        self.accumulators = None
        self.counter = None

    def register_local_var(self, var: Any) -> None:
        """Keep ``var``'s gradient local (see the optimizer's ``register_local_var``)."""
        self._reducer.register_local(var)


class _DistributedMixin:
    """Mixed into the user's optimizer class by ``DistributedOptimizer``."""

    _hvd_settings = {}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._hvd_configure(**type(self)._hvd_settings)

    def _hvd_configure(self, compression=Compression.none, sparse_as_dense=False,
                       gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                       average_aggregated_gradients=False, num_groups=0, groups=None,
                       process_set=global_process_set, scale_local_gradients=True,
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
        # Horovod's attribute: None unless gradients are accumulated over several passes
        object.__setattr__(self, "_agg_helper", GradientAggregation(
            bpps, bool(average_aggregated_gradients), reducer) if bpps > 1 else None)
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
        st = self._agg_helper
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
        count_pass = self._hvd_pass_counter()

        def _apply():
            local = [None if acc is None else acc.read_value() for acc in st.accumulators]
            if st.average_aggregated_gradients:
                local = [None if g is None else g / tf.cast(k, g.dtype) for g in local]
            apply_fn(self._hvd_reduce(local, variables), variables)
            for acc in st.accumulators:
                if acc is not None:
                    acc.assign(tf.zeros_like(acc))
            st.counter.assign(0)
            return tf.constant(True)

        def _skip():
            if count_pass is None:
                return tf.constant(False)
            with tf.control_dependencies([count_pass.assign_add(1, read_value=False)]):
                return tf.constant(False)

        return tf.cond(st.counter >= k, _apply, _skip)

    def _hvd_pass_counter(self):
        """The variable a pass that only accumulates increments (None: no such count)."""
        return None


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
        if xla_steps.compiling_update():  # (the reduction outside XLA, the update inside)
            parent_apply = xla_steps.compiled(parent_apply)
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
    (``compute_gradients`` and ``_compute_gradients``, and for ``optimizers.legacy`` classes
    ``get_gradients``) come back reduced, as in Horovod, and the next ``apply_gradients``
    for those variables applies them as given; gradients from anywhere else (a plain
    ``tf.GradientTape``) are reduced in ``apply_gradients``. With ``backward_passes_per_step``
    k > 1 the computed gradients stay local and ``apply_gradients`` accumulates them, applying
    the reduced sum every k-th pass; ``iterations`` counts every pass, as in Horovod."""

    def _hvd_pass_counter(self):
        return self.iterations

    def _aggregate_gradients(self, grads_and_vars):
        """Horovod's hook: the base optimizer's cross-replica aggregation (tf.distribute),
        not a reduction over ranks (``_compute_gradients`` and ``apply_gradients`` do that)."""
        base = super()
        if hasattr(base, "_aggregate_gradients"):
            return base._aggregate_gradients(grads_and_vars)
        return self.aggregate_gradients(grads_and_vars)

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

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """Horovod's name for ``compute_gradients`` (its optimizer has both)."""
        if grad_loss is not None:
            raise ValueError(
                "hvdlike DistributedOptimizer._compute_gradients: grad_loss is not supported "
                f"by {type(self).__name__} (a tf_keras.optimizers.Optimizer); scale the loss "
                "instead, or use a tf_keras.optimizers.legacy optimizer.")
        return self.compute_gradients(loss, var_list, tape=tape)


class _OptimizerV2Mixin(_LegacyMixin):
    """tf_keras.optimizers.legacy: ``get_gradients`` and ``_compute_gradients`` reduce."""

    def get_gradients(self, loss, params):
        return self._hvd_reduce_computed(super().get_gradients(loss, params), params)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        return self._hvd_reduced_pairs(
            super()._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape))


def distributed_class(base, settings):
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
    """Whether ``optimizer`` reduces its gradients across ranks (``DistributedOptimizer``)."""
    return isinstance(optimizer, _DistributedMixin) or optimizer_v1.is_distributed_v1(optimizer)


def unreduced(optimizer: Any) -> bool:
    """A tf_keras distributed optimizer whose ``compute_gradients`` has not reduced the
    gradients about to be applied (``apply_gradients`` will)."""
    return isinstance(optimizer, _LegacyMixin) and optimizer._hvd_reduced_for is None
