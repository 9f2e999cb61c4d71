"""What the benchmarks under scripts/ write: a Markdown table on stdout, a JSON file with the
figures and the machine they came from, and a PNG plot.

    from bench_output import figure, markdown_table, write_json
    print(markdown_table(["size", "time"], [["1 MiB", "0.4 ms"]]))
    write_json("results/x.json", {"meta": meta, "rows": rows})
    with figure("results/x.png", figsize=(7, 4)) as (fig, ax):
        ax.plot(...)
"""
import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table: one header row, then ``rows`` (cells formatted with ``str``)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: "str | os.PathLike[str]", data: Any) -> None:
    """Write ``data`` as indented JSON, making the folder if needed."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


@contextlib.contextmanager
def figure(path: "str | os.PathLike[str]", nrows: int = 1, ncols: int = 1, dpi: int = 110,
           **subplots: Any) -> Iterator[Tuple[Any, Any]]:
    """``plt.subplots(nrows, ncols, **subplots)`` on a backend that needs no display; when the
    block ends the figure is laid out, saved to ``path`` (its folder made) and closed. Yields
    ``(fig, axes)`` as ``plt.subplots`` returns them."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(nrows, ncols, **subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)


def run_json_job(cmd: Sequence[str], out: str, what: str, timeout: float,
                 env: Optional[Dict[str, str]] = None) -> Any:
    """Run a benchmark's job ``cmd``, which writes JSON to ``out``; return that JSON. A job
    that fails prints the end of its output and exits, naming ``what``."""
    done = subprocess.run(list(cmd), env=env, timeout=timeout, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    if done.returncode != 0:
        print(done.stdout[-4000:])
        raise SystemExit(f"{what} failed (status {done.returncode})")
    with open(out) as f:
        return json.load(f)
