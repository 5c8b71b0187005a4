#!/usr/bin/env bash
# The prepared GPU check (docs/GPU_CHECK.md): install, then gpu_smoke.py on the paper config and
# gpu_vllm.py (the same decode group through vLLM beside the project's engine), each part under
# its own `timeout`, so the whole check stays within ~10 minutes of device time.
#
#   benchmarks/gpu_check.sh KEY=DIR [KEY=DIR ...]          # on a GPU machine
#   benchmarks/gpu_check.sh --dry-run KEY=DIR [...]         # the CPU part only (no install, no vLLM)
#
# KEY: a model key of $CONFIG (default config/paper.yaml); DIR: its Hugging Face model folder
# (config.json, tokenizer files, *.safetensors). Records: benchmarks/results/gpu_smoke.json and
# gpu_vllm.json (OUT_DIR overrides the folder). Timeouts (seconds; their sum, 600, bounds the check):
# T_INSTALL (make install), T_VLLM_INSTALL, T_SMOKE, T_VLLM.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
[ $# -ge 1 ] || { echo "usage: $0 [--dry-run] KEY=DIR [KEY=DIR ...]" >&2; exit 2; }
CONFIG=${CONFIG:-config/paper.yaml}
OUT_DIR=${OUT_DIR:-benchmarks/results}
T_INSTALL=${T_INSTALL:-180}; T_VLLM_INSTALL=${T_VLLM_INSTALL:-180}; T_SMOKE=${T_SMOKE:-120}; T_VLLM=${T_VLLM:-120}
ITEMS=${ITEMS:-16}
DIRS=()
for kv in "$@"; do
  case "$kv" in *=*) ;; *) echo "error: expected KEY=DIR, got '$kv'" >&2; exit 2;; esac
  [ -f "${kv#*=}/config.json" ] || { echo "error: ${kv#*=} has no config.json (not a model folder)" >&2; exit 2; }
  DIRS+=(--model-dir "$kv")
done
status=0
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
# the config with the given models only, each loading from its folder (source: {kind: local})
local_config() {
  local py=$1; shift
  "$py" -c 'import sys; from safetyrepro.perf.vllm_compare import local_model_config as f
f(sys.argv[1], dict(a.split("=", 1) for a in sys.argv[3:]), sys.argv[2])' "$CONFIG" "$TMP/config.yaml" "$@"
}
if [ $DRY = 1 ]; then
  PY=${PY:-.venv/bin/python}
  local_config "$PY" "${@}" || exit 2
  # the smoke script's own CPU mode and the vLLM comparison without vLLM, tiny sizes
  timeout "$T_SMOKE" "$PY" benchmarks/gpu_smoke.py --config "$TMP/config.yaml" --device cpu \
    --quantization fp32 --items 2 --batch-size 2 --max-new-tokens 3 --oom-items 1 --profile-steps 2 \
    --extrapolate-items 1 --out "$OUT_DIR" || status=$?
  timeout "$T_VLLM" "$PY" benchmarks/gpu_vllm.py --config "$CONFIG" "${DIRS[@]}" --dry-run --items 2 \
    --batch-size 2 --max-new-tokens 3 --out "$OUT_DIR" || status=$?
  exit $status
fi
# the project's venv, with the Makefile's CUDA torch path (nvidia-smi present -> CUDA build)
timeout "$T_INSTALL" make install || { echo "gpu_check: make install failed or timed out" >&2; exit 1; }
# vLLM pins its own torch: a separate venv, so the project's venv stays as `make install` made it
if [ ! -x .venv-vllm/bin/python ]; then
  timeout "$T_VLLM_INSTALL" bash -c 'python3 -m venv .venv-vllm && .venv-vllm/bin/pip install -q vllm && .venv-vllm/bin/pip install -q -e .' \
    || { echo "gpu_check: vLLM install failed or timed out (the smoke part still runs)" >&2; status=3; }
fi
local_config .venv/bin/python "${@}" || exit 2
timeout "$T_SMOKE" .venv/bin/python benchmarks/gpu_smoke.py --config "$TMP/config.yaml" \
  --items "$ITEMS" --oom-items 8 --extrapolate-items 4 --out "$OUT_DIR" || status=$?
if [ -x .venv-vllm/bin/python ]; then
  timeout "$T_VLLM" .venv-vllm/bin/python benchmarks/gpu_vllm.py --config "$CONFIG" "${DIRS[@]}" \
    --items "$ITEMS" --out "$OUT_DIR" || status=$?
fi
exit $status
