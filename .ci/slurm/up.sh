#!/usr/bin/env bash
# Start a real single-node Slurm cluster on this machine (munged + slurmctld + slurmd), for the
# CI step that runs the workflow through profiles/slurm. Meant for a root shell in a CI VM or
# container without systemd; see docs/SLURM.md.
#
#   .ci/slurm/up.sh      # idempotent: a second call with the cluster already up does nothing
#   .ci/slurm/down.sh    # stops what this script started (by pid file), removes its configs
#
# Environment:
#   SAFETYREPRO_SLURM_STATE      state dir: pid files, logs, spool (default /tmp/safetyrepro-slurm)
#   SAFETYREPRO_SLURM_WAIT       seconds to wait for the node to become idle (default 120)
#   SAFETYREPRO_SLURM_REGISTER   seconds a started slurmd may take to register before it is
#                                restarted, at most twice (default 20)
#   SAFETYREPRO_SLURM_OVERWRITE  set to 1 to replace an /etc/slurm/slurm.conf we did not write
#
# Slurm facts this relies on (details: ../shared/cluster/SINGLE_NODE_SLURM.md):
# - the config must live at /etc/slurm/slurm.conf: the jobstep plugin strips SLURM_CONF from the
#   inner srun's environment;
# - no accounting database, so the profile polls with squeue; MinJobAge (1 h) keeps finished
#   jobs visible to squeue long enough, and to the tests' scontrol for the whole step;
# - the two fake GPUs are gres with File=/dev/null and /dev/zero (without File= the node goes
#   INVAL);
# - no cgroups: linuxproc process tracking, no task plugin.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=common.sh
source "$HERE/common.sh"

WAIT_S="${SAFETYREPRO_SLURM_WAIT:-120}"
# A node that has not registered this long after slurmd started gets its slurmd restarted (a
# fresh start sends a fresh registration), at most REGISTER_TRIES times.
REGISTER_S="${SAFETYREPRO_SLURM_REGISTER:-20}"
REGISTER_TRIES=2

die() {
    echo "slurm up: ERROR: $*" >&2
    dump_logs >&2
    echo "slurm up: stopping whatever did start" >&2
    "$HERE/down.sh" >&2 || true
    log_summary >&2
    echo "slurm up: ERROR: $*" >&2
    exit 1
}

[ "$(id -u)" = 0 ] || { echo "slurm up: ERROR: must run as root (it writes /etc/slurm and starts daemons)" >&2; exit 1; }

# --- 1. packages -------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
    || ! command -v munged >/dev/null || ! command -v sinfo >/dev/null; then
    echo "slurm up: installing slurm-wlm and munge with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq slurm-wlm munge >/dev/null; } \
        || { echo "slurm up: ERROR: apt-get could not install slurm-wlm and munge" >&2; exit 1; }
fi

# --- 2. configuration --------------------------------------------------------------------
HOST="$(hostname -s)"
# The node's real topology (CPUs, sockets, cores, threads) as slurmd detects it, so slurmd never
# drains the node for a mismatch. RealMemory is lowered by 1 GiB (daemons, Snakemake itself) and
# must not exceed the detected value, or the node is drained ("Low RealMemory").
NODE_LINE="$(slurmd -C | head -n 1)"
case "$NODE_LINE" in
    NodeName=*) ;;
    *) echo "slurm up: ERROR: 'slurmd -C' printed no node line: $NODE_LINE" >&2; exit 1 ;;
esac
DETECTED_MEM="$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$NODE_LINE")"
REAL_MEM=$(( DETECTED_MEM > 2048 ? DETECTED_MEM - 1024 : DETECTED_MEM ))
NODE_TOPOLOGY="$(sed -e 's/^NodeName=[^ ]* //' -e 's/ *RealMemory=[0-9]*//' <<<"$NODE_LINE")"

NEW_CONF="$(mktemp)"
NEW_GRES="$(mktemp)"
trap 'rm -f "$NEW_CONF" "$NEW_GRES"' EXIT
cat >"$NEW_CONF" <<EOF
$MARKER
# Single-node CI cluster; state, pid files and logs under $STATE.
ClusterName=safetyrepro
SlurmctldHost=$HOST
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=$SLURMCTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
# No cgroups on this machine.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# No accounting database: sacct does not work, the profile polls with squeue.
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default, a job without --mem would take all of the node's memory.
DefMemPerCPU=1000
# Finished jobs stay visible to squeue/scontrol this long: the status polling needs >= 3x the
# plugin's first status interval, and the tests read every job of a run with scontrol after
# the run, which takes up to ~7 min on CI's shared 2 cores (the default 300 s lost the first
# jobs; the whole Slurm step is bounded to 25 min).
MinJobAge=3600
ReturnToService=2
GresTypes=gpu
NodeName=$HOST $NODE_TOPOLOGY RealMemory=$REAL_MEM Gres=gpu:2 State=UNKNOWN
PartitionName=ci Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
cat >"$NEW_GRES" <<EOF
$MARKER
# Two fake GPUs, so two group jobs can run at once: Slurm needs a device file per GPU, any
# existing file will do.
NodeName=$HOST Name=gpu File=/dev/null
NodeName=$HOST Name=gpu File=/dev/zero
EOF

for f in "$SLURM_CONF_PATH" "$GRES_CONF_PATH"; do
    if [ -e "$f" ] && ! head -n 1 "$f" | grep -qxF "$MARKER" \
        && [ "${SAFETYREPRO_SLURM_OVERWRITE:-0}" != 1 ]; then
        echo "slurm up: ERROR: $f exists and was not written by this script;" \
             "refusing to replace it (set SAFETYREPRO_SLURM_OVERWRITE=1 to do so)" >&2
        exit 1
    fi
done

if all_running; then
    if cmp -s "$NEW_CONF" "$SLURM_CONF_PATH" && cmp -s "$NEW_GRES" "$GRES_CONF_PATH"; then
        state="$(node_state)"
        case "$state" in
            idle|mix|alloc)
                echo "slurm up: already running (node $HOST is $state); nothing to do"
                exit 0 ;;
        esac
        echo "slurm up: running, but node $HOST is '${state:-unknown}'; restarting the cluster"
    else
        echo "slurm up: configuration changed; restarting the cluster"
    fi
    "$HERE/down.sh"
elif any_running; then
    echo "slurm up: cluster partly running; restarting it"
    "$HERE/down.sh"
fi

# Fresh state: nothing of ours runs now, so the old state dir (queue, logs) can go.
rm -rf "$STATE"
mkdir -p "$STATE/slurmctld" "$STATE/slurmd" "$STATE/munge"
chmod 755 "$STATE"
chown munge:munge "$STATE/munge"
chmod 700 "$STATE/munge"

mkdir -p /etc/slurm
install -m 644 "$NEW_CONF" "$SLURM_CONF_PATH"
install -m 644 "$NEW_GRES" "$GRES_CONF_PATH"

# --- 3. munge ----------------------------------------------------------------------------
if [ ! -s /etc/munge/munge.key ]; then
    echo "slurm up: creating /etc/munge/munge.key"
    mkdir -p /etc/munge
    chown munge:munge /etc/munge
    chmod 700 /etc/munge
    runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key
chmod 400 /etc/munge/munge.key
# munged refuses a socket directory other users cannot reach; it must be 755.
mkdir -p /run/munge
chown munge:munge /run/munge
chmod 755 /run/munge

echo "slurm up: starting munged"
runuser -u munge -- munged \
    --socket=/run/munge/munge.socket.2 \
    --pid-file="$MUNGED_PID" \
    --log-file="$STATE/munge/munged.log" \
    --seed-file="$STATE/munge/munged.seed" \
    || die "munged did not start"
for _ in $(seq 1 50); do
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then break; fi
    sleep 0.2
done
munge -n </dev/null | unmunge >/dev/null || die "munge credentials do not round-trip (munge -n | unmunge)"

# --- 4. Slurm daemons --------------------------------------------------------------------
# slurmctld first, and slurmd only once the controller answers: slurmd registers once at
# start-up, and the controller pings an unregistered node again only every ~100 s, so a slurmd
# that starts while the controller is still starting can leave the node 'unk*' for minutes
# (seen once in CI on 2026-12-03: still 'unk*' after 60 s, 'SlurmdStartTime=None').
echo "slurm up: starting slurmctld"
slurmctld || die "slurmctld did not start"
deadline=$(( $(date +%s) + 30 ))
until timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; do
    [ -n "$(live_pid "$SLURMCTLD_PID" slurmctld)" ] || die "slurmctld exited during start-up"
    [ "$(date +%s)" -lt "$deadline" ] || die "slurmctld does not answer 'scontrol ping' after 30 s"
    sleep 0.5
done
echo "slurm up: starting slurmd"
slurmd || die "slurmd did not start"

# --- 5. wait for the node ----------------------------------------------------------------
deadline=$(( $(date +%s) + WAIT_S ))
slurmd_started=$(date +%s)
tries=0
state=""
while :; do
    all_running || die "a daemon exited during start-up"
    state="$(node_state)"
    case "$state" in
        idle) break ;;
        inval*|drain*) die "node $HOST is '$state': $(scontrol show node "$HOST" | grep -i reason || true)" ;;
        # "down" right after start is normal; it only counts once the deadline passes.
    esac
    now=$(date +%s)
    if [ "$now" -ge "$deadline" ]; then
        die "node $HOST not idle after ${WAIT_S}s (state: '${state:-unknown}'; slurmd restarted $tries time(s))"
    fi
    if [ $(( now - slurmd_started )) -ge "$REGISTER_S" ] && [ "$tries" -lt "$REGISTER_TRIES" ]; then
        case "$state" in
            unk*|down*|"")
                tries=$(( tries + 1 ))
                echo "slurm up: node $HOST still '${state:-unknown}' ${REGISTER_S}s after slurmd started;" \
                     "restarting slurmd so it registers again (retry $tries of $REGISTER_TRIES)"
                stop_daemon slurmd "$SLURMD_PID" || die "could not stop slurmd for a restart"
                slurmd || die "slurmd did not start again"
                slurmd_started=$(date +%s) ;;
        esac
    fi
    sleep 1
done
echo "slurm up: node $HOST is idle (partition ci, 2 fake GPUs); state and logs in $STATE"
sinfo -N -o '%N %P %t %c %m %G'
