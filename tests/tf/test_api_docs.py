"""The API reference (docs/reference/api.md, made by scripts/docs_hooks.py when the site is
built) documents every public name of hvdlike's user-facing modules, and nothing else; the
site builds with warnings as errors; docs/architecture.md's call paths name every file the
calls run."""
import html
import json
import os
import re
import subprocess
import sys
import zlib

import pytest

from mpi_harness import REPO, run_script

sys.path.insert(0, str(REPO / "scripts"))
import docs_hooks  # noqa: E402


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The documentation site, built as CI builds it (``mkdocs build --strict``)."""
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d",
                           str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _inventory(site):
    """The objects the site documents (mkdocstrings' objects.inv): their qualified names."""
    data = (site / "objects.inv").read_bytes()
    body = zlib.decompress(data.split(b"zlib.\n", 1)[1]).decode()
    return {line.split(" ", 1)[0] for line in body.splitlines()}


def test_every_public_function_and_class_is_documented_where_it_is_defined(site):
    documented = _inventory(site)
    missing = [(module, name, where) for module, entries in docs_hooks.api_entries().items()
               for name, obj, where in entries
               if (callable(obj) or isinstance(obj, type)) and where not in documented]
    assert not missing
    assert len(documented) > 150


def test_every_public_name_of_every_module_is_on_the_api_page(site):
    page = (site / "reference" / "api.html").read_text(encoding="utf-8")
    for module, _ in docs_hooks.MODULES:
        missing = [n for n in docs_hooks.public_names(module) if n not in page]
        assert not missing, (module, missing)
    assert "variable_key" not in page  # a helper the callbacks module uses, not its API


def test_the_api_page_shows_no_raw_markup_or_internal_names(site):
    """What a reader sees: no reST roles (``:class:``) left unrendered, no private aliases in
    signatures (``_core.global_process_set``), and the NumPy section without the TensorFlow
    names ``hvdlike`` offers lazily (they are documented under their own module)."""
    page = (site / "reference" / "api.html").read_text(encoding="utf-8")
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    assert not re.findall(r":(?:class|func|meth|mod):", text)
    assert not re.findall(r"\b_core\.", text)
    numpy_section = text[text.index("NumPy and GPU arrays:"):text.index("Elastic training on")]
    for name in ("BroadcastGlobalVariablesCallback", "DistributedOptimizer"):
        assert name not in numpy_section


def test_the_settings_and_hvdlikerun_pages_are_made_from_the_code(site):
    from hvdlike.base.settings import VARIABLES
    settings = (site / "reference" / "settings.html").read_text(encoding="utf-8")
    assert all(v.name in settings for v in VARIABLES)
    launcher = (site / "reference" / "hvdlikerun.html").read_text(encoding="utf-8")
    for flag in ("--elastic", "--min-np", "--restarts", "--dry-run", "--fusion-threshold-mb"):
        assert flag in launcher, flag


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
    for module, _ in docs_hooks.MODULES:
        mod = importlib.import_module(module)
        for name in docs_hooks.public_names(module):
            obj = getattr(mod, name)
            if getattr(obj, "__module__", "").startswith("hvdlike"):
                missing += [f"{module}: {m}" for m in _unannotated(obj)]
    assert not missing, sorted(set(missing))


def _section(text, heading):
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def test_architecture_md_names_every_file_the_two_profiled_calls_run(tmp_path):
    out = tmp_path / "paths.json"
    job = run_script(2, "scripts/call_path.py", "--keras", "--json", out, timeout=240)
    assert job.returncode == 0 and not job.timed_out, job.output[-5000:]
    paths = json.loads(out.read_text())
    doc = (REPO / "docs" / "architecture.md").read_text()
    sections = {"hvd.allreduce(np_array)": "## One all-reduce, top to bottom",
                "Keras gradient (one train step)": "## One Keras gradient, top to bottom"}
    assert set(paths) == set(sections), paths
    for case, heading in sections.items():
        files = [f["file"] for f in paths[case]]
        assert "transport/mpi.py" in files, (case, files)  # the data went through MPI
        unnamed = [f for f in files if f"`{f}`" not in _section(doc, heading)]
        assert unnamed == [], f"{heading!r} in docs/architecture.md does not name {unnamed}"
