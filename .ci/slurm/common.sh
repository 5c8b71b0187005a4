# Shared settings and helpers of up.sh and down.sh (sourced, not run).
STATE="${SAFETYREPRO_SLURM_STATE:-/tmp/safetyrepro-slurm}"
MARKER="# written by SafetyRepro .ci/slurm/up.sh"
SLURM_CONF_PATH=/etc/slurm/slurm.conf
GRES_CONF_PATH=/etc/slurm/gres.conf
MUNGED_PID="$STATE/munge/munged.pid"
SLURMCTLD_PID="$STATE/slurmctld.pid"
SLURMD_PID="$STATE/slurmd.pid"
DAEMON_LOGS=("$STATE/munge/munged.log" "$STATE/slurmctld.log" "$STATE/slurmd.log")

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

# stop_daemon NAME PIDFILE: TERM, wait up to 30 s, then KILL, all by pid.
stop_daemon() {
    local name="$1" pidfile="$2" pid
    pid="$(live_pid "$pidfile" "$name")"
    if [ -z "$pid" ]; then
        rm -f "$pidfile"
        return 0
    fi
    echo "slurm: stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    if ! exited "$pid" "$name" 300; then
        echo "slurm: $name (pid $pid) ignored SIGTERM for 30 s; sending SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
        exited "$pid" "$name" 50 || {
            echo "slurm: ERROR: $name (pid $pid) is still running" >&2
            return 1
        }
    fi
    rm -f "$pidfile"
}

# exited PID NAME TENTHS: wait up to TENTHS tenths of a second for the process to be gone. It
# waits on the process itself: the daemons delete their pid files before they have exited.
exited() {
    local pid="$1" name="$2" tenths="$3"
    for _ in $(seq 1 "$tenths"); do
        pid_is "$pid" "$name" || return 0
        sleep 0.1
    done
    ! pid_is "$pid" "$name"
}

# Lines every start logs and that say nothing about a failure: Debian's Slurm is built with PMIx
# but the library is not installed (no MPI here), and a fresh state dir has no state files yet.
HARMLESS_LOG_LINES='pmix|PMIx|MPI: Cannot create context|state file|Trying backup state save file'

dump_logs() {
    local f
    echo "===== scontrol show node"
    timeout 10 scontrol show node 2>&1 || true
    echo "----- daemon logs (last 40 lines each, without the harmless PMIx and state-file lines) -----"
    for f in "${DAEMON_LOGS[@]}"; do
        echo "===== $f"
        if [ -r "$f" ]; then { grep -avE "$HARMLESS_LOG_LINES" "$f" || true; } | tail -n 40; else echo "(missing)"; fi
    done
}

# The last few error, fatal and registration lines of the three daemon logs: printed last on a
# failure, so that the tail of a CI log (often all that is kept) says why.
log_summary() {
    local f lines
    echo "----- why (last error/registration lines of each daemon log) -----"
    for f in "${DAEMON_LOGS[@]}"; do
        if [ -r "$f" ]; then
            lines="$(grep -aiE 'error|fatal|regist|unable|refused|timed out' "$f" \
                | grep -avE "$HARMLESS_LOG_LINES" | tail -n 4 || true)"
            echo "$(basename "$f"): ${lines:-(no such lines)}"
        else
            echo "$(basename "$f"): (missing)"
        fi
    done
}
