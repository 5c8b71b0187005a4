#!/usr/bin/env bash
# The Slurm CI step: start the single-node cluster, run the tests marked `slurm` against it,
# and always tear it down again (also on failure or interruption). Run as root from anywhere;
# `make test-slurm` and .ci/run call it. Exit status: that of the first failing part.
#
#   PY            Python with the project installed (default: .venv/bin/python)
#   PYTEST_ARGS   extra pytest arguments (default: -q)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY="${PY:-.venv/bin/python}"

teardown() {
    timeout -k 5 120 .ci/slurm/down.sh || echo "slurm test: ERROR: down.sh failed" >&2
}
trap teardown EXIT

# Each part runs under its own `timeout` (so a hang cannot eat the teardown's time). timeout
# puts its command in a process group of its own, which a signal sent to this script's group
# (an outer timeout, Ctrl-C) does not reach; so the part runs in the background and a signal to
# this script is passed on to it before the teardown runs.
child=""
on_signal() {
    echo "slurm test: interrupted; stopping the running part and tearing down" >&2
    if [ -n "$child" ]; then
        kill -TERM "$child" 2>/dev/null
        wait "$child" 2>/dev/null
    fi
    exit "$1"
}
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

bounded() {  # bounded SECONDS COMMAND...: run COMMAND under timeout, in the background
    local limit="$1" rc
    shift
    timeout -k 10 "$limit" "$@" &
    child=$!
    wait "$child"
    rc=$?
    child=""
    return "$rc"
}

start=$(date +%s)
# up.sh retries a slurmd that does not register; a start that fails anyway (it has stopped
# everything again) gets one more whole try before the step fails.
if ! bounded 300 .ci/slurm/up.sh; then
    echo "slurm test: up.sh failed or timed out; starting the cluster once more from scratch" >&2
    bounded 300 .ci/slurm/up.sh || { echo "slurm test: ERROR: up.sh failed twice" >&2; exit 1; }
fi
echo "slurm test: cluster up in $(( $(date +%s) - start )) s"

start=$(date +%s)
# The tests marked slurm skip themselves unless this is set (only here, after up.sh succeeded).
export SAFETYREPRO_SLURM=1
# shellcheck disable=SC2086
bounded 1800 "$PY" -m pytest ${PYTEST_ARGS:--q} -m slurm
rc=$?
echo "slurm test: pytest -m slurm finished in $(( $(date +%s) - start )) s (exit $rc)"
if [ "$rc" = 5 ]; then
    echo "slurm test: ERROR: no test marked slurm was collected" >&2
fi
exit "$rc"
