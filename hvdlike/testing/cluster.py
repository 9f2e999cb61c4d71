"""A test cluster on one machine: N hosts, each a network namespace with its own host name.

    python -m hvdlike.testing.cluster up --hosts 2 --link 1gbit   # prints how to use it
    python -m hvdlike.testing.cluster down

Each host is a network namespace (``<prefix>-h<i>``) plus a UTS namespace (its own host name)
kept in a file under /run/hvdlike-cluster. Two hosts are joined by one veth pair; more go
through a bridge in a namespace of its own, so no traffic touches the machine's own network.
Addresses come from 10.231.<net>.0/24 (a private range); each host's link end can be shaped
with ``tc tbf`` (``--link 1gbit``; this kernel has no ``netem``, so bandwidth only, no latency)
and a queue of 1 ms of the link's rate.

Open MPI reaches the other hosts through ``--mca plm_rsh_agent``: a small script, written for
the cluster, that enters the named host's namespaces and runs the daemon command there.
Chosen over an sshd per namespace: nothing to install, no keys, no daemons to tear down, and
Open MPI still launches its remote daemon the same way it does through ssh. ``mpirun_argv``
gives the full command; run it on host 0 with ``run``. The module lives in the package, not
under tests/, because tests, ``scripts/bench_cluster.py`` and users trying a multi-node job on
one machine all use it. Only root can build it.
"""
import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from hvdlike.runtime import session_dirs

RUN_DIR = "/run/hvdlike-cluster"
TOOLS = ("ip", "tc", "unshare", "nsenter", "umount")


class ClusterError(RuntimeError):
    pass


_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12, "bit": 1.0}


def queue_bytes(link: str) -> int:
    """The shaped link's queue: 1 ms of its rate (125 kB at 1 Gbit/s), like a switch port's
    shallow buffer. A deep queue (tbf ``latency 400ms``: 50 MB at 1 Gbit/s) held one
    direction's ACKs behind the other's data, and an all-reduce's two opposite TCP streams
    then ran at 0.6-1.0 of the line rate from one call to the next (raw ``MPI_Allreduce``
    too); with 1 ms they ran at 0.91-1.0."""
    text = link.strip().lower()
    for unit, factor in _UNITS.items():
        if text.endswith(unit):
            try:
                bits = float(text[:-len(unit)]) * factor
            except ValueError:
                break
            return max(16_000, int(bits / 8 / 1000))
    raise ValueError(f"cannot read the link rate {link!r}: write it as tc does, e.g. 1gbit, "
                     "250mbit")


def bytes_sent() -> int:
    """Bytes this process's network namespace (a test host) has sent on its interfaces other
    than lo (``/proc/self/net/dev``; ``/sys/class/net`` would show the root namespace)."""
    total = 0
    with open("/proc/self/net/dev") as f:
        for line in f.read().splitlines()[2:]:
            dev, counters = line.split(":", 1)
            if dev.strip() != "lo":
                total += int(counters.split()[8])  # transmitted bytes
    return total


def missing_requirements() -> Optional[str]:
    """Why a cluster cannot be built here, or None."""
    if os.geteuid() != 0:
        return "building network namespaces needs root"
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        return f"missing tools: {', '.join(absent)} (iproute2, util-linux)"
    probe = f"hvdlike-probe-{os.getpid()}"
    made = _sh(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"this machine refuses network namespaces: {made.stderr.strip()}"
    _sh(["ip", "netns", "del", probe], check=False)
    return None


def _sh(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(list(argv), text=True, capture_output=True)
    if check and p.returncode != 0:
        raise ClusterError(f"`{shlex.join(argv)}` failed: {p.stderr.strip() or p.stdout.strip()}")
    return p


class Cluster:
    """``hosts`` test hosts named ``<prefix>-h0`` ...; ``link``: a tc rate (``1gbit``,
    ``250mbit``) for every host's link, or None for unshaped. Use as a context manager (torn
    down on exit, also on errors and Ctrl-C) or call ``up``/``down``."""

    def __init__(self, hosts: int = 2, link: Optional[str] = None, prefix: str = "hvdc",
                 net: int = 77) -> None:
        if hosts < 2:
            raise ValueError("a test cluster needs at least 2 hosts")
        if link:
            queue_bytes(link)  # a rate tc cannot read: say so before building anything
        self.prefix, self.link, self.net = prefix, link, net
        self.names = [f"{prefix}-h{i}" for i in range(hosts)]
        self.addresses = [f"10.231.{net}.{i + 1}" for i in range(hosts)]
        self.subnet = f"10.231.{net}.0/24"
        self.dir = os.path.join(RUN_DIR, prefix)
        self.agent = os.path.join(self.dir, "agent.sh")

    # ------------------------------------------------------------------ building

    def up(self) -> "Cluster":
        why = missing_requirements()
        if why:
            raise ClusterError(f"cannot build a test cluster: {why}")
        self.down()  # leftovers of a run that was killed
        os.makedirs(self.dir, exist_ok=True)
        try:
            for name in self.names:
                _sh(["ip", "netns", "add", name])
                uts = self._uts(name)
                open(uts, "w").close()
                _sh(["unshare", f"--uts={uts}", "hostname", name])
                self._in(name, ["ip", "link", "set", "lo", "up"])
            if len(self.names) == 2:
                self._veth(self.names[0], self.names[1])
            else:
                self._bridge()
            for i, name in enumerate(self.names):
                dev = self._dev(i)
                self._in(name, ["ip", "addr", "add", f"{self.addresses[i]}/24", "dev", dev])
                self._in(name, ["ip", "link", "set", dev, "up"])
                if self.link:
                    self._in(name, ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                                    self.link, "burst", "256kb",
                                    "limit", str(queue_bytes(self.link))])
            self._write_agent()
        except BaseException:
            self.down()
            raise
        return self

    def _uts(self, name: str) -> str:
        return os.path.join(self.dir, f"{name}.uts")

    def _dev(self, i: int) -> str:
        return f"{self.prefix}{i}"

    def _in(self, name: str, argv: Sequence[str]) -> subprocess.CompletedProcess:
        return _sh(["ip", "netns", "exec", name, *argv])

    def _veth(self, a: str, b: str) -> None:
        _sh(["ip", "link", "add", self._dev(0), "netns", a, "type", "veth", "peer", "name",
             self._dev(1), "netns", b])

    def _bridge(self) -> None:
        switch = f"{self.prefix}-sw"
        _sh(["ip", "netns", "add", switch])
        self._in(switch, ["ip", "link", "add", "br0", "type", "bridge"])
        self._in(switch, ["ip", "link", "set", "br0", "up"])
        for i, name in enumerate(self.names):
            port = f"p{i}"
            _sh(["ip", "link", "add", self._dev(i), "netns", name, "type", "veth", "peer",
                 "name", port, "netns", switch])
            self._in(switch, ["ip", "link", "set", port, "master", "br0"])
            self._in(switch, ["ip", "link", "set", port, "up"])

    def _write_agent(self) -> None:
        """The plm_rsh_agent: ``agent.sh HOST COMMAND...`` runs COMMAND on HOST (its name or
        address), inside that host's namespaces."""
        cases = "\n".join(
            f"  {name}|{address}) ns={name} ;;"
            for name, address in zip(self.names, self.addresses))
        script = f"""#!/bin/sh
# written by hvdlike.testing.cluster for the test cluster {self.prefix!r}
host="$1"; shift
case "$host" in
{cases}
  *) echo "hvdlike test cluster: unknown host $host" >&2; exit 255 ;;
esac
exec nsenter --net=/run/netns/$ns --uts={self.dir}/$ns.uts -- /bin/sh -c "$*"
"""
        with open(self.agent, "w") as f:
            f.write(script)
        os.chmod(self.agent, 0o755)

    def down(self) -> None:
        """Remove every namespace and file of this cluster (whatever exists of it)."""
        for name in self.names + [f"{self.prefix}-sw"]:
            _sh(["ip", "netns", "del", name], check=False)
            uts = self._uts(name)
            if os.path.exists(uts):
                _sh(["umount", uts], check=False)
                os.remove(uts)
        if os.path.isdir(self.dir):
            shutil.rmtree(self.dir, ignore_errors=True)
        self._remove_stale_sessions()

    def _remove_stale_sessions(self) -> None:
        for name in self.names:  # what killed Open MPI daemons left in the shared /tmp
            session_dirs.remove_stale(os.environ, hostname=name)

    def end_leftovers(self) -> List[str]:
        """Kill (SIGKILL) every process still in a test host's network namespace, e.g. what a
        crashed launcher left, and remove what they left in /tmp; return ``"host: pid
        command"`` for each process killed."""
        killed, pids = [], []
        for name in self.names:
            listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                                    text=True, check=False).stdout.split()
            for pid in map(int, listed):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        command = f.read().replace(b"\0", b" ").decode(errors="replace")
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    continue  # already gone
                killed.append(f"{name}: {pid} {command.strip()[:160]}")
                pids.append(pid)
        deadline = time.monotonic() + 5
        while any(os.path.exists(f"/proc/{pid}") for pid in pids) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        self._remove_stale_sessions()
        return killed

    def __enter__(self) -> "Cluster":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ------------------------------------------------------------------ using

    def command_on(self, host: int, argv: Sequence[str]) -> List[str]:
        """``argv`` run on host ``host`` (inside its namespaces)."""
        name = self.names[host]
        return ["nsenter", f"--net=/run/netns/{name}", f"--uts={self._uts(name)}", "--",
                *argv]

    def mpirun_argv(self, mpirun: str, slots: Sequence[int], program: Sequence[str],
                    extra: Sequence[str] = ()) -> List[str]:
        """Open MPI's ``mpirun`` with ``slots[i]`` ranks on host i, launched through the agent,
        TCP kept on the cluster's network; run the result on host 0 (``command_on(0, ...)``)."""
        return [mpirun, "-np", str(sum(slots)), "--host", self.host_list(slots),
                *self.mpi_options(), *extra, *program]

    def host_list(self, slots: Sequence[int]) -> str:
        """``address:slots`` of each host with ``slots[i]`` > 0, comma-separated."""
        return ",".join(f"{a}:{n}" for a, n in zip(self.addresses, slots) if n > 0)

    def mpi_options(self) -> List[str]:
        """What Open MPI's mpirun needs to run a job on the cluster (besides its hosts)."""
        # every test host shares this machine's cores: always let ranks outnumber them, and
        # make waiting ranks yield so they do not starve each other's TCP progress
        return ["--mca", "plm_rsh_agent", self.agent,
                "--mca", "btl_tcp_if_include", self.subnet,
                "--mca", "oob_tcp_if_include", self.subnet,
                "--mca", "mpi_yield_when_idle", "1", "--bind-to", "none", "--oversubscribe"]

    def link_device(self, host: int) -> str:
        """The name of host ``host``'s link device (inside its namespace)."""
        return self._dev(host)

    def set_link(self, host: int, up: bool) -> None:
        """Take host ``host``'s link down (a lost network) or bring it up again."""
        self._in(self.names[host], ["ip", "link", "set", self._dev(host),
                                    "up" if up else "down"])

    def link_bytes(self) -> Dict[str, int]:
        """Bytes each host has sent on its cluster link so far."""
        out = {}
        for i, name in enumerate(self.names):
            p = self._in(name, ["cat", f"/sys/class/net/{self._dev(i)}/statistics/tx_bytes"])
            out[name] = int(p.stdout.strip())
        return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hvdlike.testing.cluster",
                                description="Build or remove a test cluster of network "
                                            "namespaces (root only).")
    p.add_argument("action", choices=("up", "down"))
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--link", help="shape each host's link, e.g. 1gbit or 250mbit")
    p.add_argument("--prefix", default="hvdc")
    args = p.parse_args(argv)
    cluster = Cluster(args.hosts, args.link, args.prefix)
    try:
        if args.action == "down":
            cluster.down()
            print(f"removed test cluster {args.prefix!r}")
            return 0
        cluster.up()
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    mpirun = shutil.which("mpirun") or "mpirun"
    print(f"test cluster {args.prefix!r}: " + ", ".join(
        f"{n} = {a}" for n, a in zip(cluster.names, cluster.addresses))
        + (f", links shaped to {args.link}" if args.link else ""))
    print("run a job from host 0, e.g.:")
    print("  " + shlex.join(cluster.command_on(0, cluster.mpirun_argv(
        mpirun, [2] * args.hosts, ["python", "train.py"]))))
    print(f"remove it with: python -m hvdlike.testing.cluster down --prefix {args.prefix} "
          f"--hosts {args.hosts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
