#!/usr/bin/env bash
# The package works installed from its wheel, away from the checkout: build the wheel from the
# project's files, install it into a fresh venv, and run `safetyrepro` from a folder outside the
# checkout (certify, import lm-eval, grid on the checkout's config/paper.yaml by absolute path,
# a usage error). Fails if the schemas, the default envelope or the task files are not inside the
# wheel, or if anything resolves a path against the source checkout.
#
#   .ci/wheel_check.sh PY WORK     PY: the project's .venv python; WORK: a scratch folder
#
# The fresh venv holds only the wheel (pip --no-deps). Its third-party dependencies come from
# .venv's site-packages through a .pth file: a full install would download them again (torch's
# CPU build alone is ~200 MB). A .pth adds .venv's site-packages as a plain path after the fresh
# venv's own, and Python processes .pth files only in site folders, so .venv's editable
# safetyrepro (its __editable__ .pth) stays invisible: the check asserts that `safetyrepro` is
# imported from the wheel in the fresh venv, and `pip check` that the wheel's declared
# requirements are met by the locked versions.
set -euo pipefail
unset PYTHONPATH  # the checkout's src/ on it would stand in for the wheel
PY=${1:?usage: wheel_check.sh PY WORK}
WORK=${2:?usage: wheel_check.sh PY WORK}
REPO=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(cd "$(dirname "$PY")" && pwd)  # absolute, links kept (a venv's python is one)
PY="$BIN/$(basename "$PY")"
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
say() { echo "wheel-check: $*"; }

# 1. the wheel, from the files git tracks or would track (a copy: nothing is built in the checkout)
mkdir -p "$WORK/src"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
  | tar --null --ignore-failed-read -T - -cf -) | tar -C "$WORK/src" -xf -
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$WORK/src"
WHEEL=$(ls "$WORK"/dist/safetyrepro-*.whl)
say "built $(basename "$WHEEL")"

# 2. a fresh venv with only the wheel; the dependencies through a .pth (see above)
"$PY" -m venv --without-pip "$WORK/venv"
V="$WORK/venv/bin"
"$PY" -m pip --python "$V/python" install -q --no-deps "$WHEEL"
site() { "$1" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"; }
site "$PY" > "$(site "$V/python")/project_deps.pth"
"$PY" -m pip --python "$V/python" check

# 3. from a folder outside the checkout
mkdir -p "$WORK/elsewhere"
cd "$WORK/elsewhere"
"$V/python" - "$WORK/venv" <<'EOF'
import sys
from pathlib import Path

import safetyrepro
from safetyrepro.paths import DEFAULT_ENVELOPE, SCHEMA_DIR, TASKS_DIR
from safetyrepro.rules import load_rules
from safetyrepro.schema import load_schema
from safetyrepro.tasks.loader import load_task

venv = Path(sys.argv[1]).resolve()
for what, p in (("package", safetyrepro.__file__), ("schemas", SCHEMA_DIR), ("tasks", TASKS_DIR),
                ("default envelope", DEFAULT_ENVELOPE)):
    assert Path(p).resolve().is_relative_to(venv), f"{what} read from {p}, not from the wheel in {venv}"
load_schema("config"), load_schema("envelope"), load_schema("task"), load_task("bbq")
print(f"wheel-check: package, schemas, tasks and envelope {load_rules().stamp[:12]} from the wheel")
EOF
"$V/safetyrepro" --version
"$V/safetyrepro" grid --config "$REPO/config/paper.yaml" --json > grid.json
"$V/python" -c "import json; j = json.load(open('grid.json')); assert j['cells'] > 0, j; print('wheel-check: grid', j['cells'], 'cells')"

printf 'model,benchmark,config,score\nA,bbq,c1,0.9\nB,bbq,c1,0.5\nA,bbq,c2,0.4\nB,bbq,c2,0.5\n' > scores.csv
"$V/safetyrepro" certify scores.csv --json > certify.json
"$V/python" -c "import json; p = json.load(open('certify.json'))['pairs'][0]; assert (p['n_plus'], p['n_minus']) == (1, 1), p; print('wheel-check: certify rho_flip', p['rho_flip'])"

# real lm-eval runs (its weightless dummy model, the .venv's lm_eval) on four shared items
"$V/python" - "${SAFETYREPRO_DATA:-$REPO/../shared/data/benchmarks}" <<'EOF'
import sys
from pathlib import Path

from safetyrepro.crosspkg.localdata import write_lmeval_task
from safetyrepro.items.build import load_benchmark

items = load_benchmark("truthfulqa", Path(sys.argv[1]))
items = items[items["split"] == "validation"].reset_index(drop=True)
print(write_lmeval_task("truthfulqa", items.iloc[:4].copy(), items.iloc[4:6].copy(), Path("tasks")))
EOF
for m in alpha beta; do
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "$BIN/lm_eval" --model dummy --model_args "pretrained=$m" \
    --tasks sr_truthfulqa_mc1 --include_path tasks --output_path "lmeval-$m" --log_samples > "lmeval-$m.log" 2>&1
done
"$V/safetyrepro" import lm-eval lmeval-alpha lmeval-beta --out items.csv
"$V/safetyrepro" certify items.csv --bootstrap-samples 50 --json > items.json
"$V/python" -c "import json; j = json.load(open('items.json')); assert j['level'] == 'item' and len(j['pairs']) == 1, j; print('wheel-check: import lm-eval + certify: item level')"

set +e
"$V/safetyrepro" certify scores.csv --bootstrap-samples abc 2> usage.err
rc=$?
set -e
[ "$rc" = 2 ] && [ "$(wc -l < usage.err)" = 1 ] || { cat usage.err; echo "wheel-check: usage error gave exit $rc"; exit 1; }
say "usage error: exit 2, one line"
say ok
