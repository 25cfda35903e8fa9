#!/usr/bin/env bash
# A single-node Slurm cluster on localhost, for tests: munged, slurmctld and
# slurmd with every file (config, key, sockets, state, logs) under one folder,
# so nothing of the machine's own Slurm or munge setup is read or changed.
#
#   tests/slurm/cluster.sh start DIR   # prints `export SLURM_CONF=DIR/slurm.conf`
#   tests/slurm/cluster.sh stop DIR
#
# Needs Debian's slurmctld, slurmd, slurm-client and munge (scripts/test.sh
# installs them) and root (slurmd starts jobs as their user). Exits non-zero,
# with the daemons' logs, if the node does not come up idle within 60 s.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z $cmd || -z $dir ]]; then
    echo "usage: $0 start|stop DIR" >&2
    exit 2
fi
dir=$(mkdir -p "$dir" && cd "$dir" && pwd)

# Stops the named daemons (all three by default), each within 5 s.
stop() {
    local names=("$@")
    ((${#names[@]})) || names=(slurmd slurmctld munged)
    for name in "${names[@]}"; do
        local pidfile="$dir/$name.pid"
        if [[ -f $pidfile ]]; then
            local pid
            pid=$(cat "$pidfile")
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 50); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -9 "$pid" 2>/dev/null || true
            rm -f "$pidfile"
        fi
    done
}

logs() {
    for f in "$dir"/munged.log "$dir"/slurmctld.log "$dir"/slurmd.log; do
        [[ -f $f ]] && { echo "--- $f (last 30 lines)"; tail -n 30 "$f"; }
    done >&2
}

case $cmd in
stop)
    stop
    exit 0
    ;;
start) ;;
*)
    echo "unknown command '$cmd': expected start or stop" >&2
    exit 2
    ;;
esac

missing=()
for b in munged slurmctld slurmd sbatch squeue scontrol scancel sinfo; do
    command -v "$b" >/dev/null || [[ -x /usr/sbin/$b ]] || missing+=("$b")
done
if ((${#missing[@]})); then
    echo "cannot start the test cluster: ${missing[*]} not installed (apt-get install slurmctld slurmd slurm-client munge)" >&2
    exit 1
fi
if [[ $(id -u) != 0 ]]; then
    echo "cannot start the test cluster: slurmd must run as root (this is uid $(id -u))" >&2
    exit 1
fi
PATH=$PATH:/usr/sbin

stop # leftovers of an earlier run in the same folder
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
chmod 700 "$dir/munge"
# The key: 1024 random bytes, readable by its owner only, as munged requires.
head -c 1024 /dev/urandom >"$dir/munge/munge.key"
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed" || {
    logs
    echo "munged did not start" >&2
    exit 1
}

host=$(hostname -s)
cpus=$(nproc)
mem=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)
# The controller's port (the node's is the next one): ORCHESTRATE_TEST_SLURM_PORT,
# or 16817. Another process may hold either (a server, or an outgoing connection
# using it as its ephemeral port); a daemon that dies with "Address already in
# use" is started again on the next pair of ports, up to 10 pairs.
port=${ORCHESTRATE_TEST_SLURM_PORT:-16817}

# batch_sched_delay=0: a submitted batch job is scheduled at once (on the
# controller's next one-second tick) rather than up to 3 s later, Slurm's
# default for high submit rates; each test job took 3 s from sbatch to its
# allocation, the Slurm test 86 s in all.
write_conf() {
    cat >"$dir/slurm.conf" <<CONF
ClusterName=orchestrate-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=3600
KillWait=5
SlurmctldTimeout=30
SlurmdTimeout=30
MpiDefault=none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
}

# Whether a daemon has died: its pid file names a process that is gone, or it
# wrote none within 10 s of its start (it writes it once it has daemonized).
dead() {
    local pidfile="$dir/$1.pid"
    if [[ -f $pidfile ]]; then
        ! kill -0 "$(cat "$pidfile")" 2>/dev/null
    else
        ((SECONDS - started > 10))
    fi
}

start_daemons() {
    write_conf
    started=$SECONDS
    slurmctld -i -f "$dir/slurm.conf" || { logs; echo "slurmctld did not start" >&2; exit 1; }
    slurmd -N "$host" -f "$dir/slurm.conf" || { logs; echo "slurmd did not start" >&2; exit 1; }
}

export SLURM_CONF=$dir/slurm.conf
start_daemons
attempts=1
# Up within 60 s, judged by the clock: each sinfo is bounded too, since a client
# asking a controller that is gone waits out its own timeouts.
deadline=$((SECONDS + 60))
state=
while ((SECONDS < deadline)); do
    for daemon in slurmctld slurmd; do
        if dead "$daemon"; then
            if grep -q "Address already in use" "$dir/$daemon.log" 2>/dev/null && ((attempts < 10)); then
                echo "cluster.sh: port $port or $((port + 1)) is taken; trying $((port + 2))" >&2
                stop slurmd slurmctld
                mv "$dir/$daemon.log" "$dir/$daemon.port-$port.log"
                port=$((port + 2))
                attempts=$((attempts + 1))
                start_daemons
                deadline=$((SECONDS + 60))
                continue 2
            fi
            logs
            echo "the test cluster's $daemon exited (its log is above)" >&2
            stop
            exit 1
        fi
    done
    state=$(timeout 5 sinfo -h -N -o '%T' 2>/dev/null | head -n 1 || true)
    if [[ $state == idle ]]; then
        echo "export SLURM_CONF=$dir/slurm.conf"
        exit 0
    fi
    sleep 0.5
done
logs
echo "the test cluster's node did not become idle within 60 s (last state: '${state:-none}')" >&2
stop
exit 1
