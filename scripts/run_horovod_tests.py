#!/usr/bin/env python
"""Run Horovod's own TensorFlow test files against hvdlike, one MPI job per test.

    python scripts/run_horovod_tests.py --horovod /path/to/horovod [--ref v0.28.1] \
        [--file test_tensorflow2_keras.py] [--legacy] [--np 2] [--timeout 240] [-k EXPR] \
        [--out results/horovod_tests]

``--horovod`` is a clone of horovod/horovod (a bare git directory works: the test folder is
taken from ``--ref`` with ``git archive``). The test files are unpacked into a temporary
folder next to a small import shim that makes ``import horovod.X`` import ``hvdlike.X``, so
the tests run exactly as Horovod wrote them; nothing of Horovod's enters this repository.
Every test runs as its own ``hvdlikerun -np N python -m pytest FILE::TEST`` job with a hard
timeout. ``--legacy`` sets ``TF_USE_LEGACY_KERAS=1`` (tf_keras; ``test_tensorflow2_keras.py``
is written for it). Needs pytest, ``parameterized`` and ``mock`` (Horovod's tests use
them).

A test counts as run when it passed or failed; one that skipped itself, or whose subtests
skipped for want of a GPU (the GPU-only tests: their test case passes around the skipped
subtests), is reported with its reason and left out of the pass rate. Prints a
table, writes OUT.json.
"""
import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_output import markdown_table, write_json  # noqa: E402

# ``import horovod.a.b`` imports ``hvdlike.a.b`` and registers it under both names; the few
# Horovod internals its test utilities import are written out here.
SHIM = r'''
import importlib
import importlib.abc
import importlib.util
import sys
import types


# Horovod's internal helpers that its test utilities import (not part of its user API)
_HELPERS = {
    "horovod.common.util": (
        "from packaging import version\n"
        "def is_version_greater_equal_than(ver, target):\n"
        "    return version.parse(ver) >= version.parse(target)\n"),
    "horovod.runner.util": "",
    "horovod.runner.util.threads": (
        "import threading\n"
        "def in_thread(target, args=(), name=None, daemon=True, silent=False):\n"
        "    t = threading.Thread(target=target, args=args, name=name, daemon=daemon)\n"
        "    t.start()\n"
        "    return t\n"),
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == "horovod" or name.startswith("horovod."):
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        if spec.name in _HELPERS:
            module = types.ModuleType(spec.name)
            module.__path__ = []
            exec(_HELPERS[spec.name], module.__dict__)
            return module
        return importlib.import_module("hvdlike" + spec.name[len("horovod"):])

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Alias())
'''


def unpack_tests(horovod: Path, ref: str, into: Path) -> Path:
    """Horovod's ``test/`` folder at ``ref`` under ``into``; returns the ``test`` folder."""
    if (horovod / "test" / "parallel").is_dir() and not ref:
        return horovod / "test"
    archive = subprocess.run(["git", f"--git-dir={_git_dir(horovod)}", "archive", ref, "test"],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "test"


def _git_dir(horovod: Path) -> Path:
    return horovod / ".git" if (horovod / ".git").exists() else horovod


def write_shim(into: Path) -> Path:
    """A folder to put first on PYTHONPATH whose ``sitecustomize`` installs the alias finder
    in every Python process of the job."""
    shim = into / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM)
    return shim


def collect(test_dir: Path, env: dict, test_file: str, expr: str) -> list:
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
           test_file] + (["-k", expr] if expr else [])
    out = subprocess.run(cmd, cwd=test_dir / "parallel", env=env, capture_output=True,
                         text=True, timeout=600)
    ids = [line.strip() for line in out.stdout.splitlines()
           if line.startswith(test_file + "::")]
    if not ids:
        raise SystemExit(f"no tests collected from {test_file}:\n{out.stdout}\n{out.stderr}")
    return ids


def run_one(test_dir: Path, env: dict, test_id: str, np_: int, timeout: float) -> dict:
    cmd = ["hvdlikerun", "-np", str(np_), sys.executable, "-m", "pytest", "-q", "-rs", "-x",
           "--color=no",
           "-p", "no:cacheprovider", test_id]
    start = time.monotonic()
    try:
        out = subprocess.run(cmd, cwd=test_dir / "parallel", env=env, capture_output=True,
                             text=True, timeout=timeout)
        text, rc = out.stdout + out.stderr, out.returncode
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
            else (e.stdout or "")
        rc = None
    seconds = round(time.monotonic() - start, 1)
    reasons = re.findall(r"SKIPPED(?:\[\w+\])? \[\d+\] [^:]+:\d+: (.*)", text or "")
    if rc is None:
        outcome, detail = "failed", f"timed out after {timeout:.0f} s"
    elif rc == 0 and (reasons and not re.search(r"\d+ passed", text)
                      or any(re.search(r"\bGPU", why) for why in reasons)):
        outcome, detail = "skipped", reasons[0]  # (a GPU test skips in subtests, and passes)
    elif rc == 0:
        outcome, detail = "passed", ""
    else:
        outcome = "failed"
        errors = re.findall(r"^E +(.*)$", text, re.M)
        detail = errors[0] if errors else text.strip().splitlines()[-1][:200] if text else ""
    return {"test": test_id, "outcome": outcome, "seconds": seconds, "detail": detail[:300]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--horovod", required=True, type=Path, help="horovod/horovod clone")
    p.add_argument("--ref", default="v0.28.1", help="git ref to take test/ from ('' = as is)")
    p.add_argument("--file", default="test_tensorflow2_keras.py")
    p.add_argument("--legacy", action="store_true", help="TF_USE_LEGACY_KERAS=1 (tf_keras)")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("-k", default="", help="pytest -k expression to select tests")
    p.add_argument("--out", default="results/horovod_tests")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="hvd-tests-") as tmp:
        test_dir = unpack_tests(args.horovod.resolve(), args.ref, Path(tmp))
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
                   PYTHONPATH=os.pathsep.join(
                       [str(write_shim(Path(tmp)))] + os.environ.get("PYTHONPATH", "").split(
                           os.pathsep)).rstrip(os.pathsep))
        if args.legacy:
            env["TF_USE_LEGACY_KERAS"] = "1"
        else:
            env.pop("TF_USE_LEGACY_KERAS", None)
        ids = collect(test_dir, env, args.file, args.k)
        rows = []
        for i, test_id in enumerate(ids, 1):
            row = run_one(test_dir, env, test_id, args.np, args.timeout)
            rows.append(row)
            print(f"[{i}/{len(ids)}] {row['outcome']:7s} {row['seconds']:6.1f}s {test_id} "
                  f"{row['detail']}", flush=True)

    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("passed", "failed", "skipped")}
    ran = counts["passed"] + counts["failed"]
    rate = counts["passed"] / ran if ran else 0.0
    print()
    print(markdown_table(["test", "outcome", "s", "detail"],
                         [[r["test"].split("::")[-1], r["outcome"], r["seconds"], r["detail"]]
                          for r in rows if r["outcome"] != "passed"]))
    print(f"\n{args.file} ({'tf_keras' if args.legacy else 'Keras 3'}, np={args.np}): "
          f"{counts['passed']} of {ran} run passed ({rate:.0%}); {counts['skipped']} skipped")
    write_json(f"{args.out}.json", {
        "file": args.file, "ref": args.ref, "legacy_keras": args.legacy, "np": args.np,
        "counts": counts, "pass_rate": rate, "tests": rows})


if __name__ == "__main__":
    main()
