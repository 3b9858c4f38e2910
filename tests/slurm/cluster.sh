#!/usr/bin/env bash
# A real Slurm cluster on localhost, for the tests:
#   munged, MariaDB, slurmdbd, slurmctld and two slurmd nodes (n1, n2), each
#   with two fake GPUs (gres files are symlinks to /dev/null), in the default
#   partition debug and in a partition gpu.
#
#   cluster.sh up STATE_DIR      start everything, wait until both nodes are idle
#   cluster.sh down STATE_DIR    stop everything `up` started (safe to repeat)
#   cluster.sh status STATE_DIR  which daemons run, and sinfo
#
# Config, logs, spool, state and the database live under STATE_DIR; nothing in
# /etc is written. Client commands find the cluster through
#   export SLURM_CONF=STATE_DIR/etc/slurm.conf
# (`up` also writes STATE_DIR/env with that line). Outside STATE_DIR: munged's
# default socket under /run/munge, and the link /run/slurm/conf -> STATE_DIR/etc
# for commands that lose SLURM_CONF; so one test cluster per host, and `up`
# refuses to start beside another. Daemons run in the foreground, started by
# this script, so every pid is known from the start and `down` can stop a
# half-started cluster. Ports are chosen free at `up`. Every wait is bounded.
# Needs root.
set -euo pipefail

CLUSTER=feedbench
PARTITION=debug
GPU_PARTITION=gpu       # the same nodes again, not the default (tests/workflow/test_target_partition.py)
NODES=(n1 n2)
GPUS_PER_NODE=2
GPU_TYPE=tesla          # typed GPUs, as sites name them: gpu_model and gres:gpu:tesla:N work
CPUS_PER_NODE=4        # more than a small CI runner has: slurmd is told to trust the config
MEM_PER_NODE_MB=4000
UP_TIMEOUT_S=${SLURM_UP_TIMEOUT_S:-60}
# Slurm's default accounting flags, as sites ship it: sacct then returns no job comments. Set
# SLURM_ACCOUNTING_STORE_FLAGS=job_comment to try a cluster that keeps them (docs/reliability-slurm.md).
ACCOUNTING_STORE_FLAGS=${SLURM_ACCOUNTING_STORE_FLAGS:-}

die() { echo "cluster.sh: $*" >&2; exit 1; }

usage() { echo "usage: $0 up|down|status STATE_DIR" >&2; exit 2; }

# wait_for SECONDS "DAEMONS" COMMAND...: poll COMMAND until it succeeds; give
# up at the deadline, or at once when one of DAEMONS has exited.
wait_for() {
    local timeout=$1 daemons=$2; shift 2
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        check_alive $daemons || return 1
        if ((SECONDS >= deadline)); then
            echo "cluster.sh: timed out after ${timeout}s waiting for: $*" >&2
            return 1
        fi
        sleep 0.5
    done
}

# start NAME COMMAND...: run a foreground daemon in its own session, log its
# output, record its pid before anything else can fail.
start() {
    local name=$1; shift
    setsid "$@" >>"$STATE/log/$name.out" 2>&1 </dev/null &
    echo $! >"$STATE/run/$name.pid"
}

# A pid that runs: not gone, and not a zombie waiting for init to reap it.
running() { local stat; stat=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $stat != Z* ]]; }
alive() { [ -f "$STATE/run/$1.pid" ] && running "$(cat "$STATE/run/$1.pid")"; }

# A daemon that died while we wait for it: say so with the end of its log.
check_alive() {
    local name
    for name in "$@"; do
        alive "$name" && continue
        echo "cluster.sh: $name exited; last lines of its logs:" >&2
        tail -n 20 "$STATE/log/$name"* >&2 || true
        return 1
    done
}

free_ports() {  # N free TCP ports on 127.0.0.1
    python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

paths() {
    STATE=$(realpath -m "$1")
    ETC=$STATE/etc
    export SLURM_CONF=$ETC/slurm.conf
    # munged runs as user munge, on the default socket: Slurm 22.05's
    # connections to slurmdbd ignore AuthInfo=socket=..., so a private socket
    # cannot work.
    MUNGE_SOCKET=/run/munge/munge.socket.2
    MYSQL_SOCKET=$STATE/mysql/mysqld.sock
    # Where client commands look for slurm.conf when SLURM_CONF is unset (after
    # /etc/slurm/slurm.conf): the Snakemake jobstep plugin drops every SLURM_*
    # variable, SLURM_CONF included, before its srun inside the job.
    RUN_CONF=/run/slurm/conf
}

# Only one test cluster per host: munged's socket and /run/slurm/conf are
# host-wide. Refuse to start beside another one that still runs.
claim_host() {
    [ ! -e /etc/slurm/slurm.conf ] || die "/etc/slurm/slurm.conf exists: srun inside jobs would use it, not this cluster"
    if [ -L "$RUN_CONF" ] && [ "$(readlink "$RUN_CONF")" != "$ETC" ]; then
        local other
        other=$(dirname "$(readlink "$RUN_CONF")")
        if [ -f "$other/run/slurmctld.pid" ] && running "$(cat "$other/run/slurmctld.pid")"; then
            die "another test cluster runs in $other (bash $0 down $other)"
        fi
    elif [ -e "$RUN_CONF" ] && [ ! -L "$RUN_CONF" ]; then
        die "$RUN_CONF exists and is not ours (a configless slurmd on this host?)"
    fi
    mkdir -p "$(dirname "$RUN_CONF")"
    ln -sfn "$ETC" "$RUN_CONF"
}

write_config() {
    local ports ctld_port dbd_port
    ports=($(free_ports $((2 + ${#NODES[@]}))))
    ctld_port=${ports[0]}
    dbd_port=${ports[1]}

    mkdir -p "$ETC" "$STATE/dev"
    local i
    for ((i = 0; i < GPUS_PER_NODE; i++)); do
        ln -sfn /dev/null "$STATE/dev/gpu$i"   # gres files must be character devices
    done

    cat >"$ETC/slurm.conf" <<EOF
# Test cluster written by tests/slurm/cluster.sh; do not edit.
ClusterName=$CLUSTER
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
# No systemd, no cgroups: track processes through /proc.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default, one job takes the whole node's memory.
DefMemPerCPU=500
# Nodes are declared bigger than a CI runner: trust the config, do not drain.
SlurmdParameters=config_overrides
GresTypes=gpu
ReturnToService=2
SchedulerType=sched/backfill
# Finished jobs stay visible to squeue for 10 min: squeue-based status checks
# need MinJobAge above the longest gap between checks (180 s) plus a check.
MinJobAge=600
KillWait=5
InactiveLimit=0
MailProg=/bin/true
StateSaveLocation=$STATE/spool/slurmctld
SlurmdSpoolDir=$STATE/spool/slurmd-%n
SlurmctldPidFile=$STATE/run/slurmctld.daemon.pid
SlurmdPidFile=$STATE/run/slurmd-%n.daemon.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# Accounting through slurmdbd, so that sacct knows every job.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$dbd_port
AccountingStorageTRES=gres/gpu
$([ -z "$ACCOUNTING_STORE_FLAGS" ] || echo "AccountingStoreFlags=$ACCOUNTING_STORE_FLAGS")
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
EOF
    for ((i = 0; i < ${#NODES[@]}; i++)); do
        echo "NodeName=${NODES[i]} NodeHostname=localhost NodeAddr=127.0.0.1 Port=${ports[i + 2]} CPUs=$CPUS_PER_NODE RealMemory=$MEM_PER_NODE_MB Gres=gpu:$GPU_TYPE:$GPUS_PER_NODE State=UNKNOWN" >>"$ETC/slurm.conf"
    done
    local nodelist
    nodelist=$(IFS=,; echo "${NODES[*]}")
    echo "PartitionName=$PARTITION Nodes=$nodelist Default=YES MaxTime=INFINITE State=UP" >>"$ETC/slurm.conf"
    # A second partition over the same nodes, not the default: a site's GPU partition beside its default one.
    echo "PartitionName=$GPU_PARTITION Nodes=$nodelist Default=NO MaxTime=INFINITE State=UP" >>"$ETC/slurm.conf"

    cat >"$ETC/gres.conf" <<EOF
AutoDetect=off
NodeName=$nodelist Name=gpu Type=$GPU_TYPE File=$STATE/dev/gpu[0-$((GPUS_PER_NODE - 1))]
EOF

    # slurmdbd reaches MariaDB through its Unix socket (StorageHost=localhost
    # and MYSQL_UNIX_PORT); root logs in by unix_socket authentication.
    cat >"$ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$dbd_port
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
LogFile=$STATE/log/slurmdbd.log
PidFile=$STATE/run/slurmdbd.daemon.pid
DebugLevel=info
EOF
    chmod 600 "$ETC/slurmdbd.conf"   # slurmdbd refuses a readable one
    echo "export SLURM_CONF=$SLURM_CONF" >"$STATE/env"
}

start_munge() {
    # One munged per host: a running one (same /etc/munge/munge.key) is used
    # as it is, and left running by `down`.
    if munge_works; then
        echo "cluster.sh: using the munged already running on $MUNGE_SOCKET"
        return 0
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    # Its files go under /run/munge, which user munge owns: it may not be
    # able to enter STATE_DIR (pytest's temporary dirs are 0700).
    start munged setpriv --reuid=munge --regid=munge --init-groups \
        munged --foreground --force --socket="$MUNGE_SOCKET" --num-threads=4 \
        --pid-file=/run/munge/munged.pid --log-file=/run/munge/munged.log \
        --seed-file=/run/munge/munged.seed
    wait_for 15 munged munge_works
}
munge_works() { munge -n -S "$MUNGE_SOCKET" 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; }

start_mariadb() {
    mkdir -p "$STATE/mysql"
    if [ ! -d "$STATE/mysql/data/mysql" ]; then
        mariadb-install-db --no-defaults --user=root --datadir="$STATE/mysql/data" \
            --skip-test-db --auth-root-authentication-method=socket --innodb-log-file-size=8M \
            >"$STATE/log/mariadb-install.log" 2>&1 ||
            { tail -n 20 "$STATE/log/mariadb-install.log" >&2; return 1; }
    fi
    # No network at all; a small buffer pool keeps its footprint small.
    start mariadb mariadbd --no-defaults --user=root --datadir="$STATE/mysql/data" \
        --socket="$MYSQL_SOCKET" --pid-file="$STATE/run/mariadb.daemon.pid" \
        --skip-networking --log-error="$STATE/log/mariadb.log" \
        --innodb-buffer-pool-size=32M --innodb-log-file-size=8M --performance-schema=off
    wait_for 30 mariadb mariadb --no-defaults --socket="$MYSQL_SOCKET" -u root -e 'SELECT 1'
}

start_slurmdbd() {
    # slurmdbd reads slurmdbd.conf beside $SLURM_CONF.
    MYSQL_UNIX_PORT=$MYSQL_SOCKET start slurmdbd slurmdbd -D
    wait_for 30 slurmdbd sacctmgr -n show cluster
    # Register the cluster, and an account for the test profile to name
    # (once: a STATE_DIR brought up again keeps its database).
    sacctmgr -n -P show cluster format=Cluster | grep -qx "$CLUSTER" ||
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
    if ! sacctmgr -n -P show assoc where user=root account=feedbench format=User | grep -qx root; then
        sacctmgr -i add account feedbench Cluster="$CLUSTER" Description=tests Organization=feedbench >/dev/null
        sacctmgr -i add user root Account=feedbench Cluster="$CLUSTER" >/dev/null
    fi
}

start_slurmctld() {
    mkdir -p "$STATE/spool/slurmctld"
    start slurmctld slurmctld -D -i -f "$SLURM_CONF"
    wait_for 30 slurmctld ctld_up
}
ctld_up() { scontrol ping | grep -q 'is UP'; }

start_slurmd() {
    local node
    for node in "${NODES[@]}"; do
        mkdir -p "$STATE/spool/slurmd-$node"
        start "slurmd-$node" slurmd -D -N "$node" -f "$SLURM_CONF"
    done
    local slurmds=("${NODES[@]/#/slurmd-}")
    wait_for "$UP_TIMEOUT_S" "slurmctld ${slurmds[*]}" nodes_idle || {
        sinfo -N -l >&2 || true
        return 1
    }
}
nodes_idle() {
    [ "$(sinfo -h -N -p "$PARTITION" -t idle -o %N | sort -u | wc -l)" -eq "${#NODES[@]}" ]
}

up() {
    [ "$(id -u)" = 0 ] || die "needs root (the daemons run as root and munge)"
    local cmd
    for cmd in munged mariadbd mariadb-install-db slurmdbd slurmctld slurmd sbatch sacct; do
        command -v "$cmd" >/dev/null || die "$cmd not found: run bash tests/slurm/install.sh"
    done
    if alive slurmctld; then die "a cluster already runs in $STATE (cluster.sh down $STATE first)"; fi
    mkdir -p "$STATE/run" "$STATE/log"
    local t0=$SECONDS
    # On any failure, stop what was started: a half-started cluster never stays.
    UP_DONE=0
    trap '((UP_DONE)) || { echo "cluster.sh: up failed, stopping what started; logs in $STATE/log" >&2; down; }' EXIT
    write_config
    claim_host
    start_munge
    start_mariadb
    start_slurmdbd
    start_slurmctld
    start_slurmd
    UP_DONE=1
    echo "cluster.sh: up in $((SECONDS - t0))s: ${NODES[*]} idle, partitions $PARTITION (default) and $GPU_PARTITION; export SLURM_CONF=$SLURM_CONF"
}

# stop NAME...: TERM them all, wait up to 15 s, then KILL what is left.
stop() {
    local name pids=()
    for name in "$@"; do
        [ -f "$STATE/run/$name.pid" ] || continue
        pids+=("$(cat "$STATE/run/$name.pid")")
        rm -f "$STATE/run/$name.pid"
    done
    [ ${#pids[@]} -gt 0 ] || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    local deadline=$((SECONDS + 15)) pid left
    while :; do
        left=()
        for pid in "${pids[@]}"; do running "$pid" && left+=("$pid"); done
        [ ${#left[@]} -gt 0 ] && ((SECONDS < deadline)) || break
        sleep 0.2
    done
    for pid in "${left[@]}"; do
        echo "cluster.sh: pid $pid ignored TERM for 15 s, killing it" >&2
        kill -KILL "$pid" 2>/dev/null || true
    done
}

down() {
    [ -n "${STATE:-}" ] || return 0
    # Cancel jobs first, so no slurmstepd outlives its slurmd.
    if alive slurmctld; then
        local partition
        for partition in "$PARTITION" "$GPU_PARTITION"; do
            timeout 10 scancel --full --quiet --partition "$partition" 2>/dev/null || true
        done
        local deadline=$((SECONDS + 20))
        while ((SECONDS < deadline)) && [ -n "$(timeout 5 squeue -h -t running,completing -o %i 2>/dev/null)" ]; do
            sleep 0.5
        done
    fi
    # In order of dependence: nodes, controller, database daemon, the rest.
    stop "${NODES[@]/#/slurmd-}"
    stop slurmctld
    stop slurmdbd
    stop mariadb munged
    if [ "$(readlink "$RUN_CONF" 2>/dev/null)" = "$ETC" ]; then rm -f "$RUN_CONF"; fi
    return 0
}

status() {
    local name
    for name in munged mariadb slurmdbd slurmctld "${NODES[@]/#/slurmd-}"; do
        if alive "$name"; then echo "$name: running ($(cat "$STATE/run/$name.pid"))"; else echo "$name: stopped"; fi
    done
    if alive slurmctld; then timeout 10 sinfo -N; fi
}

[ $# -eq 2 ] || usage
paths "$2"
case $1 in
    up) up ;;
    down) down; echo "cluster.sh: down ($STATE)" ;;
    status) status ;;
    *) usage ;;
esac
