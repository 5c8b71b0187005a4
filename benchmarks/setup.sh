#!/usr/bin/env bash
# Benchmark environment (idempotent): benchmarks/.venv with the CPU torch 2.13.0 pinned,
# lm-evaluation-harness (also a pinned runtime dependency of safetyrepro since the cross-package stage)
# and the project itself (editable). Run from anywhere:  bash benchmarks/setup.sh
# GPU machines: set TORCH_SPEC=torch (or your CUDA build) before running.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
VENV="$HERE/.venv"
PY="$VENV/bin/python"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
LM_EVAL_SPEC="${LM_EVAL_SPEC:-lm-eval}"
STAMP="$VENV/.installed"

if [[ -f "$STAMP" && "$STAMP" -nt "$ROOT/pyproject.toml" && "$STAMP" -nt "$HERE/setup.sh" ]]; then
  echo "benchmarks/.venv is up to date ($("$PY" -c 'import torch, lm_eval, importlib.metadata as m; print("torch", torch.__version__, "lm-eval", m.version("lm_eval"))'))"
  exit 0
fi
test -x "$PY" || python3 -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip
# torch first, so nothing later pulls another build; every later install is constrained to it
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "$TORCH_SPEC"
TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')"
CONSTRAINTS="$VENV/constraints.txt"
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"
"$PY" -m pip install -q -c "$CONSTRAINTS" "$LM_EVAL_SPEC" psutil
"$PY" -m pip install -q -c "$CONSTRAINTS" -e "$ROOT"
"$PY" -c 'import torch, lm_eval, safetyrepro, importlib.metadata as m; print("ok: torch", torch.__version__, "lm-eval", m.version("lm_eval"))'
touch "$STAMP"
