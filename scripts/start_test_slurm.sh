#!/usr/bin/env bash
# Start (or stop) a throw-away one-node Slurm cluster for the launcher tests.
#
#   scripts/start_test_slurm.sh start [DIR]   install if needed, start munged+slurmctld+slurmd
#   scripts/start_test_slurm.sh stop  [DIR]   stop the daemons started from DIR
#
# Everything (config, munge key and socket, state, logs, pid files) lives in DIR
# (default /tmp/hvdlike-slurm); nothing under /etc is changed. Clients must use
# SLURM_CONF=DIR/slurm.conf, which `start` prints as its last line.
# Needs root (slurmd runs as root); installs slurm-wlm, munge and libpmix-dev with
# apt-get when missing, unless HVDLIKE_SLURM_NO_INSTALL=1.
# Ports: HVDLIKE_SLURMCTLD_PORT (default 16817) and HVDLIKE_SLURMD_PORT (16818).
set -euo pipefail

action=${1:-start}
dir=${2:-/tmp/hvdlike-slurm}
ctld_port=${HVDLIKE_SLURMCTLD_PORT:-16817}
slurmd_port=${HVDLIKE_SLURMD_PORT:-16818}

# Stop the daemons whose pid files are given: TERM to all at once (each takes ~2 s to
# exit), KILL whatever is still alive after 10 s.
stop_daemons() {
    local pidfile pid pids=()
    for pidfile in "$@"; do
        [[ -f $pidfile ]] || continue
        pid=$(cat "$pidfile" 2>/dev/null || true)
        rm -f "$pidfile"
        if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
    done
    for _ in $(seq 100); do
        local alive=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [[ $alive == 0 ]] && return 0
        sleep 0.1
    done
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
}

if [[ $action == stop ]]; then
    stop_daemons "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"
    exit 0
fi
if [[ $action != start ]]; then
    echo "usage: $0 start|stop [DIR]" >&2
    exit 2
fi
if [[ $(id -u) != 0 ]]; then
    echo "$0: must run as root (slurmd needs it)" >&2
    exit 2
fi

export PATH=$PATH:/usr/sbin
# libpmix-dev: Debian's mpi/pmix plugin dlopens .../pmix2/lib/libpmix.so (the -dev
# symlink); without it `srun --mpi=pmix` (needed by Open MPI 5) fails to load.
packages="slurm-wlm munge libpmix-dev"
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null \
        || ! dpkg -s libpmix-dev >/dev/null 2>&1; then
    if [[ ${HVDLIKE_SLURM_NO_INSTALL:-0} == 1 ]]; then
        echo "$0: missing Slurm packages (apt-get install $packages)" >&2
        exit 2
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $packages >/dev/null
fi

mkdir -p "$dir"/{state,spool,log}
chmod 700 "$dir"
# munge: private key, socket and pid file so a system munged is left alone.
if [[ ! -f $dir/munge.key ]]; then
    dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
    chmod 600 "$dir/munge.key"
fi
stop_daemons "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"
munged --force --key-file="$dir/munge.key" --socket="$dir/munge.sock" \
    --pid-file="$dir/munged.pid" --seed-file="$dir/munged.seed" \
    --log-file="$dir/log/munged.log"

node=$(hostname -s)
# `slurmd -C` reports this node's real layout; a larger CPUs= would drain it.
nodeline=$(slurmd -C | head -n 1 | sed -e 's/ RealMemory=[0-9]*//')
cat >"$dir/slurm.conf" <<CONF
ClusterName=hvdliketest
SlurmctldHost=$node
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
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
$nodeline State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF

export SLURM_CONF=$dir/slurm.conf
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 100); do
    if sinfo -h -o %t 2>/dev/null | grep -qx idle; then
        echo "SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 0.2
done
echo "$0: node did not become idle; see $dir/log/" >&2
sinfo >&2 || true
exit 1
