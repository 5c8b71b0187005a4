# Shared set-up: validate the config against config/schema, build the plan, and define the
# input functions and wildcard constraints every other rule file uses.
import os
import re
import shlex
import socket
import sys
import time
from pathlib import Path

from snakemake.utils import min_version

from safetyrepro.config import config_from_dict, load_config
from safetyrepro.errors import SafetyReproError
from safetyrepro import plan as plan_module
from safetyrepro.plan import SHARD_PATTERN, SHARD_ROOTS, Plan

min_version("9.0")

if len(workflow.configfiles) > 1:
    sys.exit("error: pass exactly one --configfile (jobs read that one file)")
CONFIG_PATH = str(
    Path(
        workflow.configfiles[0] if workflow.configfiles else "config/config.yaml"
    ).resolve()
)
try:
    RUN = load_config(CONFIG_PATH)
    if config and config_from_dict(config, CONFIG_PATH).data != RUN.data:
        raise SafetyReproError(
            f"{CONFIG_PATH}: --config overrides are not supported; every job reads the config "
            "file, so write the change into a config file and pass it with --configfile"
        )
except SafetyReproError as exc:
    sys.exit(f"error: {exc}")

PLAN = Plan(RUN)
RUN_T0 = time.time()

if workflow.remote_exec:
    # In a cluster job (e.g. a group of cells): the job's first Snakemake process owns the
    # workers its cells start, and stops them before the job ends (no hooks run there).
    from safetyrepro.worker.client import own_allocation_workers

    own_allocation_workers(PLAN.worker_state_root)


def rel(path):
    """Paths under the working directory are given relative to it, so targets such as
    `snakemake results/tables/cell_scores.parquet` match the rules' outputs."""
    path = os.path.abspath(path)
    inside = os.path.commonpath([path, os.getcwd()]) == os.getcwd()
    return os.path.relpath(path) if inside else path


RESULTS = rel(PLAN.results)
CONFIG = rel(CONFIG_PATH)
ENV = "../../envs/safetyrepro.yaml"  # for --software-deployment-method conda

# Every job runs the package in this interpreter's environment ("$PY" -m safetyrepro ...).
# Every path and value a rule's shell command interpolates is shell-quoted ({x:q}), so a
# results folder with a space (or a value holding "$(...)") is one argument, never code.
# RUN_ID names this invocation to the model workers (the end-of-run cleanup stops only the
# workers no other run is using); an environment variable, not a param, so it never reruns a job.
RUN_ID = f"run-{socket.gethostname().split('.')[0]}-{os.getpid()}-{int(time.time())}"
RUN_ID = re.sub(r"[^A-Za-z0-9._+-]", "_", RUN_ID)
shell.prefix(
    f"set -euo pipefail; PY={shlex.quote(sys.executable)}; "
    f"export SAFETYREPRO_RUN_ID={RUN_ID}; "
)


wildcard_constraints:
    model="|".join(re.escape(m) for m in RUN.models),
    benchmark="|".join(RUN.benchmarks),
    config=r"T[0-9A-Za-z.]+-[0-9A-Za-z.]+-k[0-9]+-(freeform|logprob)",
    seed=r"[0-9]+",


def all_targets():
    targets = [
        f"{RESULTS}/tables/cell_scores.parquet",
        f"{RESULTS}/tables/rho_flip.parquet",
    ]
    targets += analysis_targets()
    if CROSS_PACKAGE:
        targets.append(f"{TABLES}/cross_package.parquet")
    return targets


TABLES = f"{RESULTS}/tables"


def aggregate_outputs(variant):
    """The aggregation step's outputs, as the package names them."""
    return {
        k: rel(v) for k, v in plan_module.aggregate_outputs(TABLES, variant).items()
    }


PAPER_TABLES = ["table2", "table3", "table4", "parse_clean", "tau_r", "bootstrap"]
SIGNIFICANCE_TABLES = ["significance", "significance_configs", "bootstrap_items"]
FIGURES = [
    "rho_heatmap",
    "rho_significance",
    "orderings",
    "anova_shares",
    "shap_summary",
    "consistency",
]


# BBQ's bias scores exist only when the run includes BBQ.
BBQ_BIAS_TABLES = (
    [f"{TABLES}/bbq_bias.parquet", f"{TABLES}/bbq_bias_summary.parquet"]
    if "bbq" in RUN.benchmarks
    else []
)


def analysis_targets():
    targets = [f"{TABLES}/{t}.parquet" for t in PAPER_TABLES + SIGNIFICANCE_TABLES]
    targets += [
        f"{TABLES}/{t}.parquet"
        for t in (
            "anova",
            "shap",
            "robustness",
            "subsample_stability",
            "subsample_rho_flip",
            "nearest_reversal",
        )
    ]
    targets += BBQ_BIAS_TABLES
    targets += [f"{RESULTS}/cards/index.json", f"{RESULTS}/report.md"]
    targets += [f"{RESULTS}/figures/{f}.png" for f in FIGURES]
    if PLAN.precision_check:
        targets.append(f"{TABLES}/precision.parquet")
    return targets


ANALYSIS = RUN.section("analysis")
# The cross-package stage scores the benchmarks that lm-eval or Inspect have tasks for.
CROSS_PACKAGE_BENCHMARKS = [
    b for b in RUN.benchmarks if b in ("truthfulqa", "bbq", "crows_pairs")
]
CROSS_PACKAGE = bool(ANALYSIS.get("cross_package")) and bool(CROSS_PACKAGE_BENCHMARKS)


def cell_variant(wildcards):
    """The variant of a cell job, from its shard folder (main: shards/, bf16: shards_bf16/)."""
    return PLAN.variant_of_shard_root(wildcards.shards)


def cell_quantization(wildcards):
    return PLAN.quantization(wildcards.model, cell_variant(wildcards))


onstart:
    from safetyrepro.models.load import require_device
    from safetyrepro.run_summary import start_run
    from safetyrepro.scheduling import drop_local_rate_limiter

    # a config that needs a GPU (runtime.device: cuda) fails here, before any job starts
    # (a dry run, -n, skips onstart and so plans without a GPU)
    try:
        require_device(RUN)
    except SafetyReproError as exc:
        sys.exit(f"error: {exc}")
    drop_local_rate_limiter(workflow)
    start_run(RESULTS, RUN_ID)


onsuccess:
    from safetyrepro.run_summary import finish_run

    finish_run(RESULTS, RUN_T0, ok=True, run_id=RUN_ID)


onerror:
    from safetyrepro.run_summary import finish_run

    finish_run(RESULTS, RUN_T0, ok=False, snakemake_log=log, run_id=RUN_ID)
