"""MkDocs hooks (mkdocs.yml): the reference pages' generated parts, made at build time from the
code, so that they cannot drift from it: ``<!-- hvdlike:settings -->`` becomes the settings
table (``hvdlike.base.settings.reference_table``), ``<!-- hvdlike:hvdlikerun-help -->``
becomes ``hvdlikerun --help``, and ``<!-- hvdlike:api -->`` becomes one mkdocstrings entry
(``::: module.name``, rendered from its docstring and signature) for every public name of
the modules in ``MODULES``, each object once, under the first module that offers it."""
import importlib
import inspect
import os
import types
from typing import Any, Dict, List, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# the user-facing modules, in the order of the reference, each with what it is for
MODULES: List[Tuple[str, str]] = [
    ("hvdlike", "NumPy and GPU arrays: the collectives, process sets, the world, errors."),
    ("hvdlike.elastic", "Elastic training on plain MPI (ULFM)."),
    ("hvdlike.tensorflow", "TensorFlow values, `tf.function`, tf.distribute, parameter "
                           "servers (it offers the names of `hvdlike` as well)."),
    ("hvdlike.tensorflow.elastic", "Elastic states of TensorFlow objects."),
    ("hvdlike.tensorflow.keras", "Keras (`hvdlike.keras` is the same module)."),
    ("hvdlike.tensorflow.keras.callbacks", "Keras callbacks (also `hvdlike.keras.callbacks`)."),
    ("hvdlike.tensorflow.keras.elastic", "Elastic Keras training."),
    ("hvdlike.keras", "Horovod's `horovod.keras` path: the names of `hvdlike.tensorflow.keras`."),
    ("hvdlike.keras.callbacks", "The same callbacks."),
    ("hvdlike.common.exceptions", "Horovod's `horovod.common.exceptions` path."),
    ("hvdlike.tensorflow.data.compute_service", "tf.data service: a compute job's workers "
                                                "feed the training ranks (Horovod's names)."),
    ("hvdlike.runner.common.util.env", "Horovod's `horovod.runner.common.util.env` path: a "
                                       "process's rank and size before `init()`."),
]


def public_names(module_name: str) -> List[str]:
    """The names a user reaches through ``module_name``: its ``__all__`` where it has one, else
    its names without a leading underscore (lazy TensorFlow names included) that hvdlike
    defines (no submodules, nothing merely imported from typing or NumPy)."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        names = {n for n in dir(module) if not n.startswith("_")}
        names |= set(getattr(module, "_LAZY_MODULE_OF", {}))
    return sorted(n for n in names if not isinstance(getattr(module, n), types.ModuleType)
                  and getattr(getattr(module, n), "__module__", "hvdlike").startswith("hvdlike"))


def home(obj: Any, fallback: str) -> str:
    """Where ``obj`` is documented: ``module.qualname`` for a function or class."""
    module = getattr(obj, "__module__", None) or fallback
    return f"{module if module.startswith('hvdlike') else fallback}.{obj.__qualname__}"


def api_entries() -> Dict[str, List[Tuple[str, Any, str]]]:
    """Per module of ``MODULES``: (name, object, where it is documented) for each public name
    not documented under an earlier module; values (``Average``, ``global_process_set``) are
    documented where they are reached, by name."""
    seen: Dict[int, str] = {}
    out: Dict[str, List[Tuple[str, Any, str]]] = {}
    later = {id(getattr(importlib.import_module(m), n)) for m, _ in MODULES[1:]
             for n in public_names(m)}
    for module_name, _ in MODULES:
        module = importlib.import_module(module_name)
        entries = out.setdefault(module_name, [])
        lazy = set(getattr(module, "_LAZY_MODULE_OF", {}))
        for name in public_names(module_name):
            obj = getattr(module, name)
            if id(obj) in seen or (name in lazy and id(obj) in later):
                continue  # a TensorFlow name ``hvdlike`` offers lazily: under its own module
            where = (home(obj, module_name) if inspect.isclass(obj) or inspect.isfunction(obj)
                     else f"{module_name}.{name}")
            seen[id(obj)] = where
            entries.append((name, obj, where))
    return out


def api_reference() -> str:
    lines: List[str] = []
    by_module = api_entries()
    for module_name, what in MODULES:
        entries = by_module[module_name]
        lines += [f"## `{module_name}`", "", what, ""]
        if not entries:
            lines += ["Every name here is documented above.", ""]
            continue
        values = [(n, o) for n, o, w in entries if not (inspect.isclass(o) or inspect.isfunction(o))]
        for name, obj, where in entries:
            if inspect.isclass(obj) or inspect.isfunction(obj):
                lines += [f"::: {where}", "    options:", "      heading_level: 3", ""]
                if name != obj.__name__:
                    lines += [f"`{module_name}.{name}` is another name for it.", ""]
        if values:
            lines += ["### Values", "", "| name | value |", "|---|---|"]
            lines += [f"| `{module_name}.{n}` | `{_value(o)}` |" for n, o in values]
            lines.append("")
    return "\n".join(lines)


def _value(obj: Any) -> str:
    text = repr(obj)
    if text == "ProcessSet(process_set_id=None, ranks=[], mpi_comm=None)":
        return "the global process set (every rank; id 0 once hvdlike.init() has run)"
    return text.replace("|", "\\|")


def settings_table() -> str:
    from hvdlike.base.settings import reference_table
    return reference_table()


def hvdlikerun_help() -> str:
    from hvdlike.runner.launch import command_line
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal's width
    try:
        text = command_line().format_help()
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return f"```text\n{text}```\n"


MARKERS = {"<!-- hvdlike:settings -->": settings_table,
           "<!-- hvdlike:hvdlikerun-help -->": hvdlikerun_help,
           "<!-- hvdlike:api -->": api_reference}


def on_page_markdown(markdown: str, **_: Any) -> str:
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
