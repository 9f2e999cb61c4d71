"""What ``DistributedOptimizer`` changes in Keras itself, so that a Horovod script runs with
only its import line changed and every rank decides alike: a ``LossScaleOptimizer`` around a
distributed optimizer agrees on skipping a step across ranks; with ``jit_compile`` on, Keras
3's train step is compiled by XLA around the collectives (``xla_steps``; on other backends
than TensorFlow ``jit_compile="auto"`` means off); Keras 3's ``compile``
accepts tf_keras's ``experimental_run_tf_function``; Keras 3 optimizers answer to tf_keras's
``variables()`` and ``lr``. ``install`` applies them (``hvdlike.tensorflow.optimizer`` does
at import); each patch leaves Keras's behaviour alone where no distributed optimizer is
involved."""
import functools
from typing import Any, Callable

import tensorflow as tf

from hvdlike import Min
from hvdlike.tensorflow import compat, ops, xla_steps
from hvdlike.tensorflow.optimizer_classes import is_distributed_optimizer, unreduced


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
                object.__setattr__(state, "_hvdlike_inner",
                                   inner if unreduced(inner) else None)
            return local_apply(self, *args, **kwargs)
        return apply_gradients

    for cls in (module.LossScaleOptimizer, module.LossScaleOptimizerV3):
        cls.apply_gradients = agreeing(cls.apply_gradients)



def _wraps_a_distributed_optimizer(optimizer: Any) -> bool:
    """True for a distributed optimizer, also inside LossScaleOptimizers."""
    while optimizer is not None:
        if is_distributed_optimizer(optimizer):
            return True
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return False


def _auto_jit_off_beyond_tensorflow(local_resolve: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """Keras 3's resolution of ``jit_compile="auto"``, off for a model whose optimizer is
    distributed when Keras runs on another backend than TensorFlow (JAX would trace the
    TensorFlow collectives); else Keras's."""
    def _resolve_auto_jit_compile(self):
        if compat.keras().backend.backend() != "tensorflow" and \
                _wraps_a_distributed_optimizer(getattr(self, "optimizer", None)):
            return False
        return local_resolve(self)

    _resolve_auto_jit_compile._hvdlike_resolves = True
    return _resolve_auto_jit_compile


def _no_auto_xla_beyond_tensorflow():
    """With a DistributedOptimizer and Keras on JAX or torch, ``jit_compile="auto"`` means
    off (on TensorFlow, ``xla_steps`` compiles the step around the collectives)."""
    owner = compat.keras3_model_method_owner("_resolve_auto_jit_compile")
    if owner is None or getattr(owner._resolve_auto_jit_compile, "_hvdlike_resolves", False):
        return
    owner._resolve_auto_jit_compile = _auto_jit_off_beyond_tensorflow(
        owner._resolve_auto_jit_compile)


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


def install() -> None:
    """Apply every patch above (each once: installing again changes nothing)."""
    _agree_on_loss_scale_decisions()
    _no_auto_xla_beyond_tensorflow()
    xla_steps.install(_wraps_a_distributed_optimizer)
    _take_horovods_compile_flag()
    _keras2_names_on_keras3_optimizers()
