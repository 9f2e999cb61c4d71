"""docs/api.md lists every public name of hvdlike's user-facing modules, and nothing else."""
import re
import subprocess
import sys

from mpi_harness import REPO

sys.path.insert(0, str(REPO / "scripts"))
import gen_api_docs  # noqa: E402


def _documented():
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    return set(re.findall(r"^### `([A-Za-z_][A-Za-z0-9_]*)", text, re.M))


def test_every_public_name_is_in_the_api_reference():
    documented = _documented()
    for module in gen_api_docs.MODULES:
        missing = [n for n in gen_api_docs.public_names(module) if n not in documented]
        assert not missing, (f"{module}: {missing} are missing from docs/api.md; run "
                             "python scripts/gen_api_docs.py")


def test_the_api_reference_lists_no_name_that_is_gone():
    public = {n for m in gen_api_docs.MODULES for n in gen_api_docs.public_names(m)}
    assert _documented() <= public, sorted(_documented() - public)


def test_the_generator_runs_as_a_script():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_api_docs.py"), "--check"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 1), out.stderr[-2000:]  # 1: out of date, said so
    assert out.returncode == 0 or "out of date" in out.stdout


def _unannotated(obj):
    """The parameters (and "return") of ``obj``'s public functions that have no type hint:
    ``obj`` itself if a function, else its ``__init__`` and public methods."""
    import inspect
    if inspect.isfunction(obj):
        functions = [(obj.__name__, obj)]
    elif inspect.isclass(obj):
        functions = [(f"{obj.__name__}.{k}", v) for k, v in vars(obj).items()
                     if inspect.isfunction(v) and (k == "__init__" or not k.startswith("_"))]
    else:
        return []
    missing = []
    for name, function in functions:
        signature = inspect.signature(function)
        missing += [f"{name}({p.name})" for p in signature.parameters.values()
                    if p.annotation is p.empty and p.name not in ("self", "cls")
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if signature.return_annotation is signature.empty:
            missing.append(f"{name} -> ?")
    return missing


def test_every_public_function_and_class_of_the_api_has_type_hints():
    import importlib
    missing = []
    for module in gen_api_docs.MODULES:
        mod = importlib.import_module(module)
        for name in gen_api_docs.public_names(module):
            obj = getattr(mod, name)
            if getattr(obj, "__module__", "").startswith("hvdlike"):
                missing += [f"{module}: {m}" for m in _unannotated(obj)]
    assert not missing, sorted(set(missing))
