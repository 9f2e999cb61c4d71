"""``python -m hvdlike.runner.bind_shim``: print the path of the bind shim's library
(``hvdlike.base.bind_shim``), building it on first use, for a plain ``mpirun`` or ``srun``:
``mpirun -x LD_PRELOAD=$(python -m hvdlike.runner.bind_shim) ...``."""
import sys

from ..base import bind_shim


def main() -> int:
    path = bind_shim.library()
    if path is None:
        print("hvdlike.runner.bind_shim: cannot build the shim (needs Linux and a C compiler: "
              "cc, gcc, or $CC)", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
