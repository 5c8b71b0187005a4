#!/usr/bin/env bash
# Stop the single-node Slurm cluster started by .ci/slurm/up.sh: cancel its jobs, stop slurmd,
# slurmctld and munged by their pid files (never by process name), wait until they have exited,
# and remove the /etc/slurm configs up.sh wrote. Safe to run when nothing is up.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=common.sh
source "$HERE/common.sh"

[ "$(id -u)" = 0 ] || { echo "slurm down: ERROR: must run as root" >&2; exit 1; }

# Jobs first, so no slurmstepd (and no job's processes) outlive the daemons.
if [ -n "$(live_pid "$SLURMCTLD_PID" slurmctld)" ]; then
    jobs="$(timeout 10 squeue -h -o '%i' 2>/dev/null || true)"
    if [ -n "$jobs" ]; then
        echo "slurm down: cancelling jobs: $(echo $jobs)"
        # shellcheck disable=SC2086
        timeout 10 scancel $jobs || true
        for _ in $(seq 1 30); do
            [ -z "$(timeout 10 squeue -h -t running,completing -o '%i' 2>/dev/null || true)" ] && break
            sleep 1
        done
    fi
fi

rc=0
stop_daemon slurmd "$SLURMD_PID" || rc=1
stop_daemon slurmctld "$SLURMCTLD_PID" || rc=1
stop_daemon munged "$MUNGED_PID" || rc=1

# Remove the configs only if up.sh wrote them.
for f in "$SLURM_CONF_PATH" "$GRES_CONF_PATH"; do
    if [ -e "$f" ] && head -n 1 "$f" | grep -qxF "$MARKER"; then
        rm -f "$f"
    fi
done

if [ "$rc" = 0 ]; then echo "slurm down: stopped (logs kept in $STATE)"; fi
exit "$rc"
