#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for kbframe's Slurm launcher test.
#
#   sudo scripts/slurm_local.sh start    # install slurm-wlm, munge, slurmdbd and mariadb when
#                                        # missing, write a minimal slurm.conf and
#                                        # slurmdbd.conf, start munged, mariadb, slurmdbd,
#                                        # slurmctld and slurmd, wait until the node is idle
#   sudo scripts/slurm_local.sh stop     # stop them
#   scripts/slurm_local.sh status        # sinfo
#
# Debian/Ubuntu, as root. Accounting goes to slurmdbd (MariaDB) because submitit polls job
# states with sacct: without an accounting database every poll prints "Slurm accounting
# storage is disabled" and a "Bypassing sacct error" warning.
# Overrides: SLURM_CONF (default /etc/slurm/slurm.conf), KBFRAME_SLURM_CPUS (default: all).
set -euo pipefail

CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
DBD_CONF=$(dirname "$CONF")/slurmdbd.conf
NODE=$(hostname -s)
CPUS=${KBFRAME_SLURM_CPUS:-$(nproc)}
LOG=/var/log/slurm

need_root() {
    if [ "$(id -u)" != 0 ]; then
        echo "slurm_local.sh: $1 needs root (sudo scripts/slurm_local.sh $1)" >&2
        exit 2
    fi
}

install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
            && command -v sinfo >/dev/null && command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null; then
        return
    fi
    echo "slurm_local.sh: installing slurm-wlm, munge, slurmdbd and mariadb-server" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends slurm-wlm munge slurmdbd mariadb-server >/dev/null
}

write_conf() {
    mkdir -p "$(dirname "$CONF")" /var/spool/slurmctld /var/spool/slurmd "$LOG"
    cat > "$CONF" <<CONF
# written by kbframe scripts/slurm_local.sh: one node, no accounting, no cgroups
ClusterName=kbframe
SlurmctldHost=$NODE
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
NodeName=$NODE CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
    cat > "$DBD_CONF" <<CONF
# written by kbframe scripts/slurm_local.sh: accounting in the local MariaDB
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=kbframe
StorageLoc=slurm_acct_db
PidFile=/run/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
CONF
    chmod 600 "$DBD_CONF"
}

start_accounting() {
    if ! mysqladmin ping >/dev/null 2>&1; then
        service mariadb start >/dev/null
    fi
    mysql -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
              CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'kbframe';
              GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
    pgrep -x slurmdbd >/dev/null || slurmdbd
    local t0=$SECONDS
    until sacctmgr -n list cluster >/dev/null 2>&1; do
        if (( SECONDS - t0 > 30 )); then
            echo "slurm_local.sh: slurmdbd not answering after 30 s; see $LOG/slurmdbd.log" >&2
            return 1
        fi
        sleep 0.25
    done
    sacctmgr -n list cluster format=cluster | grep -qw kbframe || sacctmgr -i add cluster kbframe >/dev/null
}

start_munge() {
    if pgrep -x munged >/dev/null; then
        return
    fi
    mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
    chmod 0700 /etc/munge /var/lib/munge /var/log/munge
    chmod 0755 /run/munge
    chmod 0400 /etc/munge/munge.key
    runuser -u munge -- /usr/sbin/munged
}

wait_idle() {
    local t0=$SECONDS state=""
    while (( SECONDS - t0 < 60 )); do
        state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null | head -1 || true)
        case "$state" in
            idle|mixed|allocated) echo "slurm_local.sh: node $NODE $state after $(( SECONDS - t0 )) s ($CPUS CPUs)"; return 0 ;;
        esac
        if [ "$state" = "down" ] || [ "$state" = "drained" ]; then
            scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
        fi
        sleep 0.5
    done
    echo "slurm_local.sh: node $NODE not idle after 60 s (state '${state:-none}'); see $LOG/slurmd.log, $LOG/slurmctld.log" >&2
    return 1
}

start() {
    need_root start
    install
    write_conf
    start_munge
    start_accounting
    pgrep -x slurmctld >/dev/null || slurmctld -f "$CONF"
    pgrep -x slurmd >/dev/null || slurmd -f "$CONF"
    wait_idle
}

stop() {
    need_root stop
    for d in slurmd slurmctld slurmdbd munged; do
        pkill -x "$d" 2>/dev/null || true
    done
    service mariadb stop >/dev/null 2>&1 || true
    for _ in $(seq 40); do
        pgrep -x slurmd >/dev/null || pgrep -x slurmctld >/dev/null || pgrep -x slurmdbd >/dev/null \
            || pgrep -x munged >/dev/null || break
        sleep 0.25
    done
    echo "slurm_local.sh: stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) sinfo ;;
    *) echo "usage: scripts/slurm_local.sh start|stop|status" >&2; exit 2 ;;
esac
