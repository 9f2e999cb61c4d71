"""Slurm across the test cluster's hosts: slurmctld on host 0 and one slurmd per host, each
inside its host's namespaces, so a job's tasks run on real (test) nodes with their own host
names and reach each other over the cluster's links. Root only; needs Debian's slurm-wlm and
munge (``scripts/start_test_slurm.sh`` installs them), and ``unshare``: each slurmd gets a mount
namespace with its own TmpFS directory, as separate machines would have.

    with Cluster(hosts=2) as cluster, SlurmOnCluster(cluster, "/tmp/slurm") as slurm:
        slurm.run(["sbatch", ...])        # Slurm's commands, run on host 0

Everything (config, munge key, state, logs) lives in the given directory; what holds Unix
sockets (munge's socket, slurmd's spool, the nodes' TmpFS) in a short-named directory of
its own under /tmp, since a socket's path has at most 108 bytes. One
munged in this machine's own namespace serves every host: its socket is a file, which the
namespaces share. The node names are the hosts' names, with their addresses as NodeAddr, so
no name service is needed.
"""
import os
import shutil
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from .cluster import Cluster, ClusterError

DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol")
SBIN = "/usr/sbin"


def missing_slurm() -> Optional[str]:
    """Why Slurm cannot run on the test cluster here, or None."""
    path = os.environ.get("PATH", "") + os.pathsep + SBIN
    absent = [d for d in DAEMONS if shutil.which(d, path=path) is None]
    if absent:
        return (f"missing {', '.join(absent)} (apt-get install slurm-wlm munge libpmix-dev, "
                "or run scripts/start_test_slurm.sh once)")
    return None


class SlurmOnCluster:
    """slurmctld on host 0 and a slurmd on every host of ``cluster`` (see module doc)."""

    def __init__(self, cluster: Cluster, directory: str) -> None:
        self.cluster, self.dir = cluster, os.path.abspath(directory)
        self.conf = os.path.join(self.dir, "slurm.conf")
        self._procs: List[subprocess.Popen] = []
        self.env = dict(os.environ, SLURM_CONF=self.conf,
                        PATH=os.environ.get("PATH", "") + os.pathsep + SBIN)
        self.sockets = ""  # the short-named directory (made by start)

    def start(self) -> "SlurmOnCluster":
        why = missing_slurm()
        if why:
            raise ClusterError(f"cannot start Slurm on the test cluster: {why}")
        names = self.cluster.names
        for sub in ("state", "log"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.sockets = tempfile.mkdtemp(prefix="hvds-", dir="/tmp")
        for sub in ("tmp", *(f"spool/{n}" for n in names), *(f"tmp-{n}" for n in names)):
            os.makedirs(os.path.join(self.sockets, sub), exist_ok=True)
        key = os.path.join(self.dir, "munge.key")
        if not os.path.exists(key):
            with open(key, "wb") as f:
                f.write(os.urandom(1024))
            os.chmod(key, 0o600)
        try:
            self._spawn(["munged", "--foreground", "--force", f"--key-file={key}",
                         f"--socket={self.sockets}/munge.sock",
                         f"--pid-file={self.dir}/munged.pid",
                         f"--seed-file={self.dir}/munged.seed",
                         f"--log-file={self.dir}/log/munged.log"])
            self._write_conf()
            self._spawn(self.cluster.command_on(0, ["slurmctld", "-D", "-f", self.conf]))
            for i, name in enumerate(names):
                # a /tmp of its own (TmpFS): Slurm's PMIx plugin makes the same directory
                # names there for a step on every node
                tmp = os.path.join(self.sockets, "tmp")
                self._spawn(self.cluster.command_on(i, [
                    "unshare", "--mount", "--propagation", "private", "sh", "-c",
                    f"mount --bind {tmp}-{name} {tmp} && "
                    f"exec slurmd -D -f {self.conf} -N {name}"]))
            self._wait_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, argv: Sequence[str]) -> None:
        log = open(os.path.join(self.dir, "log", f"{len(self._procs)}.out"), "w")
        self._procs.append(subprocess.Popen(list(argv), env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT))
        time.sleep(0.2)  # munged's socket, slurmctld's port
        if self._procs[-1].poll() is not None:
            raise ClusterError(f"`{' '.join(argv)}` exited at once; see {self.dir}/log/")

    def _write_conf(self) -> None:
        layout = subprocess.run(["slurmd", "-C"], env=self.env, capture_output=True,
                                text=True, check=True).stdout.splitlines()[0].split()
        hardware = " ".join(w for w in layout if not w.startswith(("NodeName=", "RealMemory=")))
        c = self.cluster
        nodes = "\n".join(f"NodeName={n} NodeAddr={a} {hardware} State=UNKNOWN"
                          for n, a in zip(c.names, c.addresses))
        d, short = self.dir, self.sockets
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=hvdliketestcluster
SlurmctldHost={c.names[0]}({c.addresses[0]})
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={short}/munge.sock
StateSaveLocation={d}/state
TmpFS={short}/tmp
SlurmdSpoolDir={short}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
{nodes}
PartitionName=test Nodes={",".join(c.names)} Default=YES MaxTime=INFINITE State=UP
""")

    def _wait_idle(self, seconds: float = 30.0) -> None:
        deadline = time.monotonic() + seconds
        states: List[str] = []
        while time.monotonic() < deadline:
            p = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
            states = p.stdout.split("\n")
            if p.returncode == 0 and len([s for s in states if s.endswith(" idle")]) == len(
                    self.cluster.names):
                return
            time.sleep(0.3)
        raise ClusterError(f"Slurm's nodes did not become idle in {seconds:.0f} s "
                           f"(sinfo: {states}); see {self.dir}/log/")

    def run(self, argv: Sequence[str], check: bool = True, timeout: float = 60,
            env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        """A Slurm client command (sbatch, scontrol, ...) run on host 0."""
        return subprocess.run(self.cluster.command_on(0, list(argv)),
                              env=dict(self.env, **(env or {})), capture_output=True,
                              text=True, timeout=timeout, check=check)

    def wait(self, job: str, timeout: float = 300) -> str:
        """``scontrol show job``'s line for ``job`` once it has ended (not ``sbatch --wait``:
        that polls only every 10 s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.run(["scontrol", "-o", "show", "job", job]).stdout
            if not any(f"JobState={s} " in state
                       for s in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")):
                return state
            time.sleep(0.3)
        raise ClusterError(f"Slurm job {job} did not end in {timeout:.0f} s")

    def stop(self) -> None:
        for p in reversed(self._procs):
            p.terminate()
        deadline = time.monotonic() + 10
        for p in self._procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._procs = []
        if self.sockets:
            shutil.rmtree(self.sockets, ignore_errors=True)
            self.sockets = ""

    def __enter__(self) -> "SlurmOnCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
