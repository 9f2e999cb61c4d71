"""``hvdlikerun``: its command line (Horovod's ``horovodrun`` flags included), turned into an
``mpirun``/``mpiexec``/``srun`` command (``command.py``) that it runs (``process.py``).

The launcher never manages processes itself: it builds the MPI launcher's argv and runs it
(never through a shell), returning its exit status. See docs/launcher.md.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional, Sequence

from ..base import bind_shim
from . import death_watch, horovod_flags
from .command import (
    LAUNCHERS,
    LaunchError,
    build_command,
    elastic_args,
    format_command,
    local_cores,
    on_this_machine,
    uses_srun,
)
from .mpi_flavor import Flavor
from .process import run_with_restarts

ABORT_TIMEOUT = 60.0  # seconds a job may still run after the MPI printed an abort notice


def command_line() -> argparse.ArgumentParser:
    """hvdlikerun's command line (its help is docs/reference/hvdlikerun.md)."""
    parser = argparse.ArgumentParser(
        prog="hvdlikerun", allow_abbrev=False,
        usage="hvdlikerun -np N [-H HOSTS | --hostfile FILE] [--mpi-args ARGS] "
              "[--launcher auto|mpirun|srun] [--elastic [--min-np N]] [--restarts K "
              "[--state-dir DIR]] [--abort-timeout S] [--verbose] [--dry-run] program "
              "[args ...]",
        description="Run a program as N MPI ranks with the mpirun/mpiexec/srun found here.")
    parser.add_argument("-np", "--num-proc", dest="np", type=int, metavar="N",
                        help="number of ranks (required)")
    parser.add_argument("-H", "--hosts", metavar="HOSTS", help="host list, e.g. node1:4,node2:4")
    parser.add_argument("-hostfile", "--hostfile", metavar="FILE",
                        help="host file in your MPI's own format")
    parser.add_argument("--mpi-args", default="", metavar="ARGS",
                        help='extra launcher arguments, one shell-quoted string; '
                             'write --mpi-args="--flag" when it is a single flag')
    parser.add_argument("--launcher", choices=LAUNCHERS, default="auto",
                        help="auto: srun inside a Slurm allocation, else mpirun (default)")
    parser.add_argument("--mpirun", metavar="PATH",
                        help="the mpirun/mpiexec to use (default: next to python, then PATH)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print the command to stderr before running it")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the command to stdout and exit without running it")
    parser.add_argument("--elastic", action="store_true",
                        help="survive dead ranks: run MPI with ULFM (Open MPI 5 --with-ft "
                             "ulfm) so that hvdlike.elastic.run goes on with the survivors")
    parser.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int, metavar="N",
                        help="elastic: stop when fewer than N ranks are left (implies --elastic)")
    parser.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int, metavar="N",
                        help="elastic: start new ranks in place of dead ones, up to N (at most "
                             "-np; implies --elastic)")
    parser.add_argument("--restarts", type=int, default=0, metavar="K",
                        help="relaunch a failed job up to K times; it resumes from the state "
                             "committed under --state-dir")
    parser.add_argument("--abort-timeout", type=float, default=ABORT_TIMEOUT, metavar="S",
                        help="end the job when it still runs S seconds after the MPI printed "
                             "an abort notice (off with --elastic) or after hvdlikerun was sent "
                             f"SIGINT, SIGTERM or SIGHUP (default {ABORT_TIMEOUT:g}; 0: never)")
    parser.add_argument("--state-dir", metavar="DIR",
                        help="where hvdlike.elastic states commit to and resume from "
                             "(HVDLIKE_STATE_DIR)")
    horovod_flags.add_to(parser)
    parser.add_argument("program", nargs=argparse.REMAINDER, help="the command each rank runs")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console entry point of ``hvdlikerun``; returns the exit code (2 for usage errors)."""
    parser = command_line()
    args = parser.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if args.check_build or args.version:
        from .. import __version__
        from .check_build import report
        print(report(args.mpirun) if args.check_build else __version__, flush=True)
        return 0
    if args.np is None:
        parser.error("-np N is required: the number of ranks to start, e.g. -np 2")
    why = horovod_flags.refused(args)
    if why:
        parser.error(why)
    try:
        notes = horovod_flags.apply_config_file(args) if args.config_file else []
    except ValueError as exc:
        parser.error(str(exc))
    for note in notes + horovod_flags.notes(args):
        print(f"hvdlikerun: note: {note}", file=sys.stderr, flush=True)
    if args.abort_timeout < 0:
        parser.error(f"--abort-timeout must be 0 or more seconds, got {args.abort_timeout:g}")
    try:
        settings = horovod_flags.settings_env(args)
        settings.update(_fault_tolerance_env(args))
    except ValueError as exc:
        parser.error(str(exc))
    elastic = args.elastic or args.min_np is not None or args.max_np is not None

    def flavor_args(flavor: Flavor) -> List[str]:
        out = horovod_flags.launcher_args(args, flavor) if horovod_flags.launcher_options_given(
            args) else []
        out += elastic_args(flavor, args.mpirun) if elastic else []
        if (args.max_np is not None and not (args.hosts or args.hostfile)
                and args.np <= local_cores()):
            # Open MPI keeps a dead rank's slot: without this a new rank finds none, although
            # the dead rank's core is free (more than -np ranks never run at once)
            out.append("--oversubscribe")
        return out

    srun = uses_srun(args.launcher, os.environ, args.hosts, args.hostfile)
    # srun names a dead task itself; under --elastic the survivors name it
    deaths = (death_watch.for_job(args.hosts, args.hostfile, os.environ, args.np)
              if not (args.dry_run or elastic or srun) else None)
    if deaths is not None:
        settings.update([deaths.variable])
    try:
        if elastic and srun:
            raise LaunchError("--elastic runs under mpirun (Open MPI with ULFM); srun ends the "
                              "job step when a rank dies. Use --launcher mpirun inside the "
                              "allocation")
        cmd, env = build_command(
            args.np, program, hosts=args.hosts, hostfile=args.hostfile,
            mpi_args=args.mpi_args or "", binding_args=args.binding_args or "",
            launcher=args.launcher,
            env={**os.environ, **settings, **bind_shim.preload_env(os.environ)},
            mpirun=args.mpirun,
            flavor_args=flavor_args if (elastic or horovod_flags.launcher_options_given(args))
            else None)
    except LaunchError as exc:
        if deaths is not None:
            deaths.close()
        parser.error(str(exc))
    shim = bind_shim.library()
    if (not srun and shim and shim in env.get("LD_PRELOAD", "").replace(":", " ").split()
            and on_this_machine(args.hosts, args.hostfile, env)):
        # the bind shim keeps the MPI's launcher off every interface but loopback (its
        # out-of-band channel has no bind setting); the ranks do not inherit this
        env["HVDLIKE_BIND_LOOPBACK"] = "1"
    line = format_command(cmd, env)
    if args.dry_run:
        print(line, flush=True)
        return 0
    if args.verbose:
        print(f"hvdlikerun: {line}", file=sys.stderr, flush=True)
    try:
        # under --elastic the survivors go on after a rank's error: a notice is not the end
        return run_with_restarts(cmd, env, args.restarts, 0.0 if elastic else args.abort_timeout,
                                 deaths, signal_grace=args.abort_timeout,
                                 done_grace=args.abort_timeout if elastic else 0.0)
    finally:
        if deaths is not None:
            deaths.close()


def _fault_tolerance_env(args: argparse.Namespace) -> Dict[str, str]:
    """The variables --min-np, --restarts and --state-dir set (ValueError when they are bad)."""
    env: Dict[str, str] = {}
    if args.min_np is not None:
        if not 1 <= args.min_np <= args.np:
            raise ValueError(f"--min-np must lie in 1..{args.np} (-np), got {args.min_np}")
        env["HVDLIKE_ELASTIC_MIN_NP"] = str(args.min_np)
    if args.max_np is not None:
        if args.max_np < args.np:
            raise ValueError(f"--max-np {args.max_np} is below -np {args.np}")
        env["HVDLIKE_ELASTIC_MAX_NP"] = str(args.max_np)
    if args.restarts < 0:
        raise ValueError(f"--restarts must be 0 or more, got {args.restarts}")
    if args.state_dir is not None:
        env["HVDLIKE_STATE_DIR"] = os.path.abspath(args.state_dir)
    if args.restarts:
        env["HVDLIKE_RESTART"] = "0"  # the attempt; set here so that -x forwards it to hosts
    return env
