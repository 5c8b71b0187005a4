# Shared settings and helpers of up.sh and down.sh (sourced, not run).
STATE="${SAFETYREPRO_SLURM_STATE:-/tmp/safetyrepro-slurm}"
MARKER="# written by SafetyRepro .ci/slurm/up.sh"
SLURM_CONF_PATH=/etc/slurm/slurm.conf
GRES_CONF_PATH=/etc/slurm/gres.conf
MUNGED_PID="$STATE/munge/munged.pid"
SLURMCTLD_PID="$STATE/slurmctld.pid"
SLURMD_PID="$STATE/slurmd.pid"

# True if process $1 exists, is the program $2 (guards against a reused pid) and is not a zombie.
pid_is() {
    local pid="$1" name="$2" stat
    [ -n "$pid" ] || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || return 1
    stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
    # Field 3 of /proc/PID/stat (after the parenthesised name) is the state; Z = zombie.
    stat="${stat##*) }"
    [ "${stat%% *}" != Z ]
}

# The pid in pid file $1 if that process is alive and is the program $2; prints nothing
# otherwise.
live_pid() {
    local pidfile="$1" name="$2" pid
    pid="$(tr -dc '0-9' 2>/dev/null <"$pidfile")" || true
    if pid_is "$pid" "$name"; then echo "$pid"; fi
}

any_running() {
    [ -n "$(live_pid "$MUNGED_PID" munged)" ] || [ -n "$(live_pid "$SLURMCTLD_PID" slurmctld)" ] \
        || [ -n "$(live_pid "$SLURMD_PID" slurmd)" ]
}

all_running() {
    [ -n "$(live_pid "$MUNGED_PID" munged)" ] && [ -n "$(live_pid "$SLURMCTLD_PID" slurmctld)" ] \
        && [ -n "$(live_pid "$SLURMD_PID" slurmd)" ]
}

# Short state of this machine's node as sinfo prints it (idle, mixed, down*, inval, ...).
node_state() {
    timeout 10 sinfo -h -N -n "$(hostname -s)" -o '%t' 2>/dev/null | head -n 1 || true
}

dump_logs() {
    local f
    echo "----- daemon logs (last 40 lines each) -----"
    for f in "$STATE/munge/munged.log" "$STATE/slurmctld.log" "$STATE/slurmd.log"; do
        echo "===== $f"
        if [ -r "$f" ]; then tail -n 40 "$f"; else echo "(missing)"; fi
    done
    echo "===== scontrol show node"
    timeout 10 scontrol show node 2>&1 || true
}
