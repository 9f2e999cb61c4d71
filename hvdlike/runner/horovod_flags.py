"""The ``horovodrun`` flags a Horovod user types, accepted by ``hvdlikerun``.

Tuning flags become the hvdlike setting they name (an environment variable every rank
reads); launch flags become the MPI's own options; flags that change nothing under horovodrun
with Open MPI or MPICH either are taken and change nothing here; flags that change neither
what a job computes nor where it runs but have no hvdlike equivalent (tuning, Gloo, timeouts
of checks hvdlikerun does not make) are taken with a one-line note saying so, as the
``HOROVOD_*`` variables of the same settings are; the others (launch and discovery mechanisms)
are refused with what to do instead. None is silently dropped. ``--config-file`` reads a
horovodrun YAML file as the flags its keys stand for (``config_file.py``).
"""
import argparse
import os
from typing import Any, Dict, List, Optional

from .mpi_flavor import Flavor

# flag -> (setting it sets, how its value becomes the setting's, help)
SETTINGS = {
    "--fusion-threshold-mb": ("HVDLIKE_FUSION_THRESHOLD",
                              lambda v: str(int(float(v) * 1024 * 1024)),
                              "fusion buffer size in MiB"),
    "--cycle-time-ms": ("HVDLIKE_CYCLE_TIME", str, "engine cycle time in milliseconds"),
    "--cache-capacity": ("HVDLIKE_CACHE_CAPACITY", str, "response cache entries"),
    "--timeline-filename": ("HVDLIKE_TIMELINE", str,
                            "write the timeline: rank 0 to this path, rank r > 0 with "
                            ".rank<r> added"),
    "--stall-check-warning-time-seconds": ("HVDLIKE_STALL_CHECK_TIME_SECONDS", str,
                                           "report a stalled collective after this long"),
    "--stall-check-shutdown-time-seconds": ("HVDLIKE_STALL_SHUTDOWN_TIME_SECONDS", str,
                                            "end the job after a stall this long"),
    "--log-level": ("HVDLIKE_LOG_LEVEL", str, "trace, debug, info, warning, error or fatal"),
    "--autotune-log-file": ("HVDLIKE_AUTOTUNE_LOG", str,
                            "with --autotune: rank 0 writes every sample and the choice here "
                            "(CSV)"),
    "--autotune-warmup-samples": ("HVDLIKE_AUTOTUNE_WARMUP_SAMPLES", str,
                                  "autotune samples at the starting settings, not scored"),
    "--autotune-steps-per-sample": ("HVDLIKE_AUTOTUNE_STEPS_PER_SAMPLE", str,
                                    "training steps per autotune sample"),
    "--autotune-bayes-opt-max-samples": ("HVDLIKE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", str,
                                         "autotune samples of the search"),
}
SWITCHES = {  # flags without a value -> (setting, value, help; None: hidden, as in horovodrun)
    "--timeline-mark-cycles": ("HVDLIKE_TIMELINE_MARK_CYCLES", "1",
                               "mark engine rounds in the timeline"),
    "--no-timeline-mark-cycles": ("HVDLIKE_TIMELINE_MARK_CYCLES", "0", None),
    "--no-stall-check": ("HVDLIKE_STALL_CHECK_DISABLE", "1", "turn the stall inspector off"),
    "--stall-check": ("HVDLIKE_STALL_CHECK_DISABLE", "0", None),
    "--hierarchical-allreduce": ("HVDLIKE_HIERARCHICAL_ALLREDUCE", "1",
                                 "all-reduce inside each node, then across nodes"),
    "--no-hierarchical-allreduce": ("HVDLIKE_HIERARCHICAL_ALLREDUCE", "0",
                                    "one flat all-reduce over every rank"),
    "--hierarchical-allgather": ("HVDLIKE_HIERARCHICAL_ALLGATHER", "1",
                                 "all-gather node by node (hvdlike's default)"),
    "--no-hierarchical-allgather": ("HVDLIKE_HIERARCHICAL_ALLGATHER", "0",
                                    "one flat all-gather over every rank"),
    "--autotune": ("HVDLIKE_AUTOTUNE", "1",
                   "tune the knobs not given (fusion threshold, cycle time, ...) during the "
                   "first all-reduces (docs/performance.md#autotune)"),
    "--no-autotune": ("HVDLIKE_AUTOTUNE", "0", None),
}
# accepted and without effect, as in horovodrun with Open MPI or MPICH, or already so here
NO_EFFECT = ("--disable-cache", "--mpi", "--tcp", "--log-without-timestamp",
             "--log-hide-timestamp", "--no-mpi-threads-disable")
_DISCOVERY = ("hvdlike's elastic mode has no host discovery: it goes on with the survivors "
              "and, with --max-np, starts new ranks in place of the dead on the hosts it has "
              "(docs/reliability.md)")
# taken, with this note (flag -> (takes a value, note))
NOTED = {
    "--start-timeout": (True, "no effect: it bounds horovodrun's own checks of the hosts (ssh, "
                              "network interfaces) before the launch, which hvdlikerun does "
                              "not make; the MPI launcher reports hosts it cannot reach, and "
                              "`timeout N hvdlikerun ...` bounds the whole job"),
    "--gloo": (False, "hvdlike runs on MPI only: this job uses MPI"),
    "--gloo-timeout-seconds": (True, "no effect: hvdlike runs on MPI only"),
    "--mpi-threads-disable": (False, "no effect: hvdlike initialises MPI with "
                                     "MPI_THREAD_MULTIPLE (its engine has a thread of its "
                                     "own); for your own mpi4py calls next to it see "
                                     "hvdlike.exclusive_mpi() in docs/multinode.md"),
    "--num-nccl-streams": (True, "no effect: hvdlike runs its NCCL collectives on one stream"),
    "--thread-affinity": (True, "no effect: hvdlike does not pin its engine thread; bind the "
                                "ranks with --binding-args"),
    "--log-with-timestamp": (False, "no effect: hvdlike's log lines carry no timestamp; "
                                    "--prefix-output-with-timestamp stamps every line of "
                                    "output"),
    "--autotune-gaussian-process-noise": (True, "no effect: hvdlike's autotune searches with "
                                                "optuna's TPE sampler, which has no noise term"),
}
REFUSED = {
    "--torus-allreduce": "hvdlike has no torus all-reduce; for the two-level (node, then across "
                         "nodes) all-reduce use --hierarchical-allreduce, or leave "
                         "HVDLIKE_HIERARCHICAL_ALLREDUCE=auto to measure it",
    "--jsrun": "hvdlikerun starts ranks with mpirun or srun (--launcher); start them with "
               "jsrun yourself where you must: hvdlike.init() needs nothing from hvdlikerun",
    "--host-discovery-script": _DISCOVERY,
    "--slots-per-host": _DISCOVERY,
    "--elastic-timeout": _DISCOVERY,
    "--reset-limit": _DISCOVERY,
    "--blacklist-cooldown-range": _DISCOVERY,
}


class _Interfaces(argparse.Action):
    """``--network-interface(s)``, given once or more, each a name or subnet or a
    comma-separated list of them: their union, in order, comma-separated."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        items = (getattr(namespace, self.dest) or "").split(",") + str(values).split(",")
        joined = ",".join(dict.fromkeys(i.strip() for i in items if i.strip()))
        setattr(namespace, self.dest, joined or None)


def add_to(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("horovodrun's flags (a Horovod job script keeps working)")
    for flag, (_, _, help_text) in SETTINGS.items():
        group.add_argument(flag, metavar="VALUE", help=help_text)
    for flag, (_, _, help_text) in SWITCHES.items():
        group.add_argument(flag, action="store_true", help=help_text or argparse.SUPPRESS)
    group.add_argument("-p", "--ssh-port", type=int, help="ssh port of the other hosts")
    group.add_argument("-i", "--ssh-identity-file", help="ssh key for the other hosts")
    group.add_argument("--network-interface", "--network-interfaces", action=_Interfaces,
                       help="network interface(s) or subnet(s) MPI uses, e.g. eth0 (the flag "
                            "may be repeated)")
    group.add_argument("--output-filename", help="directory for each rank's output (Open MPI)")
    group.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp",
                       action="store_true", help="stamp each line of output (Open MPI)")
    group.add_argument("--binding-args", metavar="ARGS",
                       help="the launcher's process binding options, e.g. '--bind-to core' "
                            "(instead of hvdlikerun's --bind-to none)")
    group.add_argument("-cb", "--check-build", action="store_true",
                       help="print the frameworks, controllers and tensor operations this "
                            "installation can run, and exit")
    group.add_argument("--version", action="store_true", help="print hvdlike's version and exit")
    group.add_argument("--config-file", metavar="FILE",
                       help="horovodrun's YAML file of settings (params, timeline, stall_check, "
                            "...); flags given here win over it")
    for flag in NO_EFFECT:
        group.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for flag, (takes_value, _) in NOTED.items():
        group.add_argument(flag, default=None, help=argparse.SUPPRESS,
                           **({"metavar": "VALUE"} if takes_value else {"action": "store_const",
                                                                       "const": ""}))
    for flag in REFUSED:
        group.add_argument(flag, nargs="?", const="", default=None, help=argparse.SUPPRESS)


def _attr(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def apply_config_file(args: argparse.Namespace) -> List[str]:
    """Set the flags ``--config-file`` stands for on ``args``, except where the command line
    gave the flag or its opposite; the notes on the file's keys that were left out.
    ValueError for a file that cannot be read as horovodrun's."""
    from . import config_file

    settings, notes = config_file.read(args.config_file)
    for flag, value, overridden_by in settings:
        if not any(getattr(args, _attr(f)) not in (None, False) for f in overridden_by):
            setattr(args, _attr(flag), _parsed(flag, value))
    return notes


def _parsed(flag: str, value: Optional[str]) -> Any:
    """What argparse stores for ``flag`` given with ``value``."""
    if flag in SETTINGS:
        return value
    if flag in NOTED:
        return value if NOTED[flag][0] else ""
    return True  # SWITCHES and NO_EFFECT


def notes(args: argparse.Namespace) -> List[str]:
    """One line for the flags given that are taken without an hvdlike equivalent, per note."""
    flags_of: Dict[str, List[str]] = {}
    for flag, (_, why) in NOTED.items():
        if getattr(args, _attr(flag)) is not None:
            flags_of.setdefault(why, []).append(flag)
    return [f"{', '.join(flags)}: {why}" for why, flags in flags_of.items()]


def refused(args: argparse.Namespace) -> Optional[str]:
    """The message for the first flag given that hvdlike cannot honour, else None."""
    for flag, why in REFUSED.items():
        if getattr(args, _attr(flag)) is not None:
            return f"{flag}: {why}"
    return None


def settings_env(args: argparse.Namespace) -> Dict[str, str]:
    """The HVDLIKE_* variables the flags given set."""
    env = {}
    for flag, (name, convert, _) in SETTINGS.items():
        value = getattr(args, _attr(flag))
        if value is not None:
            try:
                env[name] = convert(value)
            except ValueError:
                raise ValueError(f"{flag} {value!r} is not a number") from None
    given: Dict[str, str] = {}
    for flag, (name, value, _) in SWITCHES.items():
        if getattr(args, _attr(flag)):
            if name in env and env[name] != value:
                raise ValueError(f"{given[name]} and {flag} contradict each other; give one")
            env[name], given[name] = value, flag
    if args.network_interface and "NCCL_SOCKET_IFNAME" not in os.environ:
        names = [i for i in args.network_interface.split(",") if "/" not in i]
        if names:  # NCCL's own sockets too, as horovodrun does (NCCL takes no subnets)
            env["NCCL_SOCKET_IFNAME"] = ",".join(names)
    return env


def launcher_options_given(args: argparse.Namespace) -> bool:
    """Whether any flag that becomes an MPI launcher option was given."""
    return bool(args.ssh_port is not None or args.ssh_identity_file or args.network_interface
                or args.output_filename or args.prefix_output_with_timestamp)


def launcher_args(args: argparse.Namespace, flavor: Flavor) -> List[str]:
    """The MPI launcher's options for -p/-i/--network-interface/--output-filename/
    --prefix-output-with-timestamp."""
    ssh = []
    if args.ssh_port is not None:
        ssh += ["-p", str(args.ssh_port)]
    if args.ssh_identity_file:
        ssh += ["-i", args.ssh_identity_file]
    out: List[str] = []
    if flavor is Flavor.OPENMPI:
        if ssh:
            out += ["--mca", "plm_rsh_args", " ".join(ssh)]
        if args.network_interface:
            out += ["--mca", "btl_tcp_if_include", args.network_interface]
            oob = _without_loopback(args.network_interface)
            if oob:
                out += ["--mca", "oob_tcp_if_include", oob]
        if args.output_filename:
            out += ["--output-filename", args.output_filename]
        if args.prefix_output_with_timestamp:
            out.append("--timestamp-output")
        return out
    if ssh:
        out += ["-launcher", "ssh", "-launcher-exec", " ".join(["ssh"] + ssh)]
    if args.network_interface:
        out += ["-iface", args.network_interface]
    if args.output_filename:
        raise ValueError("--output-filename: MPICH and Intel MPI have no such option; pass "
                         "theirs through --mpi-args (e.g. -outfile-pattern)")
    if args.prefix_output_with_timestamp:
        raise ValueError("--prefix-output-with-timestamp: MPICH and Intel MPI have no such "
                         "option; pass theirs through --mpi-args (e.g. -prepend-rank)")
    return out


def _without_loopback(interfaces: str) -> str:
    """``interfaces`` (names or subnets, comma-separated) less the loopback ones, for Open
    MPI's out-of-band channel: its launcher refuses a list of loopback only ("No network
    interfaces were found for out-of-band communications") and uses loopback on one machine
    by itself, so ``--network-interface lo`` names the ranks' network alone."""
    import ipaddress
    loopback = ipaddress.ip_network("127.0.0.0/8")
    kept = []
    for item in (i.strip() for i in interfaces.split(",") if i.strip()):
        if "/" in item:
            try:
                if ipaddress.ip_network(item, strict=False).subnet_of(loopback):
                    continue
            except (ValueError, TypeError):  # not IPv4: Open MPI says what it makes of it
                pass
        elif _is_loopback(item):
            continue
        kept.append(item)
    return ",".join(kept)


def _is_loopback(name: str) -> bool:
    """Whether this machine's interface ``name`` is a loopback device (IFF_LOOPBACK)."""
    try:
        with open(f"/sys/class/net/{name}/flags") as f:
            return bool(int(f.read(), 16) & 0x8)
    except (OSError, ValueError):
        return name == "lo"
