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
