#!/usr/bin/env bash
# A real one-node SLURM cluster (munge + slurmctld + slurmd) on localhost, everything under DIR.
#
#   tests/slurm/cluster.sh start DIR   # prints: export SLURM_CONF=DIR/slurm.conf
#   tests/slurm/cluster.sh stop DIR    # cancels the jobs, stops the daemons; safe to run twice
#
# Needs root (the daemons run as root, no systemd). Installs slurmctld slurmd slurm-client munge
# with apt-get when sbatch is missing. SHARDSMITH_SLURM_PORT (default 6817) is slurmctld's port,
# slurmd takes the next one: give two clusters on one machine different ports.
# Why each slurm.conf key is there: /work/shared/notes/slurm-on-one-machine.md (or the comments below).
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
mkdir -p "$2"
DIR=$(cd "$2" && pwd)
CONF=$DIR/slurm.conf
SOCKET=$DIR/munge/munge.socket
PORT=${SHARDSMITH_SLURM_PORT:-6817}

# A pid is ours while /proc/PID/cmdline names the daemon (PID 1 here reaps late: a zombie has none).
running() {  # running PID NAME
    [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q "$2"
}

alive() {  # alive PIDFILE NAME
    [ -s "$1" ] && running "$(cat "$1")" "$2"
}

stop_daemon() {  # stop_daemon PIDFILE NAME
    local pid i
    alive "$1" "$2" || { rm -f "$1"; return 0; }
    pid=$(cat "$1")
    kill -TERM "$pid" 2>/dev/null || true
    # wait for the process, not the pid file: a daemon may remove its pid file before it has exited
    for i in $(seq 100); do
        running "$pid" "$2" || { rm -f "$1"; return 0; }
        sleep 0.1
    done
    echo "cluster.sh: $2 (pid $pid) ignored SIGTERM for 10 s; sending SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
    rm -f "$1"
}

start() {
    [ "$(id -u)" -eq 0 ] || { echo "cluster.sh: needs root (the SLURM daemons run as root here)" >&2; exit 1; }
    if ! command -v sbatch >/dev/null || ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
        command -v apt-get >/dev/null || { echo "cluster.sh: sbatch is missing and there is no apt-get to install it" >&2; exit 1; }
        echo "cluster.sh: installing slurmctld slurmd slurm-client munge (apt-get)" >&2
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            slurmctld slurmd slurm-client munge >&2
    fi
    if alive "$DIR/slurmctld.pid" slurmctld && alive "$DIR/slurmd.pid" slurmd && alive "$DIR/munge/munged.pid" munged; then
        echo "cluster.sh: already running in $DIR" >&2
        echo "export SLURM_CONF=$CONF"
        return 0
    fi
    stop  # leftovers of a half-started cluster
    mkdir -p "$DIR/munge" "$DIR/state" "$DIR/spool" "$DIR/log"
    chmod 711 "$DIR/munge"

    [ -s "$DIR/munge/munge.key" ] || mungekey -c -k "$DIR/munge/munge.key"
    chmod 600 "$DIR/munge/munge.key"
    munged -f --key-file="$DIR/munge/munge.key" --socket="$SOCKET" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed"
    wait_for "munged" "munge -S $SOCKET -n </dev/null | unmunge -S $SOCKET >/dev/null"

    cat >"$CONF" <<EOF
# One-node test cluster written by tests/slurm/cluster.sh (do not edit: rewritten at every start)
ClusterName=shardsmith-test
SlurmctldHost=localhost
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job waits this long before it starts again (default 120 s)
AuthInfo=socket=$SOCKET,cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# schedule at once (else about 3 s between passes)
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
# a job whose dependency failed is cancelled instead of pending forever
DependencyParameters=kill_invalid_depend
ReturnToService=2
MailProg=/bin/true
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$(($(awk '/^MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512)) State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

    export SLURM_CONF=$CONF
    slurmctld -c -f "$CONF"
    slurmd -N localhost -f "$CONF"
    wait_for "the idle node" "sinfo -h -o %t 2>/dev/null | grep -qx idle"
    alive "$DIR/slurmctld.pid" slurmctld || { echo "cluster.sh: slurmctld did not start; see $DIR/log/slurmctld.log" >&2; exit 1; }
    alive "$DIR/slurmd.pid" slurmd || { echo "cluster.sh: slurmd did not start; see $DIR/log/slurmd.log" >&2; exit 1; }
    echo "cluster.sh: one-node cluster up in $DIR (logs in $DIR/log)" >&2
    echo "export SLURM_CONF=$CONF"
}

wait_for() {  # wait_for WHAT COMMAND: up to 20 s
    local i
    for i in $(seq 200); do
        if bash -c "$2"; then return 0; fi
        sleep 0.1
    done
    echo "cluster.sh: no $1 after 20 s; logs in $DIR/log" >&2
    stop
    exit 1
}

stop() {
    if [ -f "$CONF" ] && alive "$DIR/slurmctld.pid" slurmctld; then
        SLURM_CONF=$CONF scancel --quiet --full --signal=KILL -u root 2>/dev/null || true
        SLURM_CONF=$CONF scancel --quiet -u root 2>/dev/null || true
        local i
        for i in $(seq 100); do  # let slurmd end the job steps before it goes
            [ -z "$(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null | head -1)" ] && break
            sleep 0.1
        done
    fi
    stop_daemon "$DIR/slurmd.pid" slurmd
    stop_daemon "$DIR/slurmctld.pid" slurmctld
    stop_daemon "$DIR/munge/munged.pid" munged
}

case $action in
    start) start ;;
    stop) stop; echo "cluster.sh: stopped (no daemons left for $DIR)" >&2 ;;
    *) usage ;;
esac
