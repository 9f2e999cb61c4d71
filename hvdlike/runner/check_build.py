"""``hvdlikerun --check-build`` (Horovod's ``horovodrun --check-build``): what this
installation can run, in Horovod's layout, so that scripts that grep for ``[X] TensorFlow``
or ``[X] MPI`` keep working. Nothing is imported that would start MPI or TensorFlow."""
import importlib.metadata
import importlib.util
import re
from typing import List, Optional, Tuple

from .mpi_flavor import find_mpirun, parse_flavor, version_text


def report(mpirun: Optional[str] = None) -> str:
    """The report: frameworks, controllers and tensor operations, each ``[X]`` or ``[ ]``
    with what was found (versions, the MPI launcher) in parentheses."""
    from .. import __version__
    from ..runtime import capabilities

    tensorflow = _version("tensorflow") if importlib.util.find_spec("tensorflow") else None
    if tensorflow and _version("keras"):
        tensorflow += f", Keras {_version('keras')}"
    mpi = _mpi(mpirun)
    nccl = capabilities.nccl_built()
    sections: List[Tuple[str, List[Tuple[str, Optional[str]]]]] = [
        ("Available Frameworks", [("TensorFlow", tensorflow), ("PyTorch", None),
                                  ("MXNet", None)]),
        ("Available Controllers", [("MPI", mpi), ("Gloo", None)]),
        ("Available Tensor Operations", [("NCCL", "CuPy" if nccl else None), ("DDL", None),
                                         ("CCL", None), ("MPI", mpi), ("Gloo", None)]),
    ]
    lines = [f"hvdlike v{__version__}:"]
    for title, items in sections:
        lines += ["", f"{title}:"]
        lines += [f"    [{'X' if found else ' '}] {name}" + (f" ({found})" if found else "")
                  for name, found in items]
    return "\n".join(lines)


def _version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _mpi(mpirun: Optional[str]) -> Optional[str]:
    """The MPI the ranks would run on: mpi4py installed and a launcher that says which MPI it
    is; None otherwise."""
    if importlib.util.find_spec("mpi4py") is None:
        return None
    launcher = mpirun or find_mpirun()
    if launcher is None:
        return None
    try:
        text = version_text(launcher)
    except Exception:  # noqa: BLE001 - a launcher that does not run: no MPI to offer
        return None
    flavor = parse_flavor(text)
    if flavor is None:
        return None
    # Open MPI: "mpirun (Open MPI) 5.0.11"; hydra: "Version:   5.0.2"
    found = re.search(r"(?:Open MPI\)|Version:|Library)\s*\D*?(\d+(?:\.\d+)+)", text)
    name = {"openmpi": "Open MPI", "mpich": "MPICH", "intel": "Intel MPI"}[flavor.value]
    return f"{name}{' ' + found.group(1) if found else ''}, {launcher}"
