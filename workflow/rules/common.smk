# Shared set-up: validate the config against config/schema, build the plan, and define the
# input functions and wildcard constraints every other rule file uses.
import os
import sys
import time
from pathlib import Path

from safetyrepro.config import config_from_dict, load_config
from safetyrepro.errors import SafetyReproError
from safetyrepro.plan import Plan

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


def rel(path):
    """Paths under the working directory are given relative to it, so targets such as
    `snakemake results/tables/cell_scores.parquet` match the rules' outputs."""
    path = os.path.abspath(path)
    inside = os.path.commonpath([path, os.getcwd()]) == os.getcwd()
    return os.path.relpath(path) if inside else path


RESULTS = rel(PLAN.results)
CONFIG = rel(CONFIG_PATH)
ENV = "../../envs/safetyrepro.yaml"  # for --software-deployment-method conda

# Every job runs the package in this interpreter's environment ("$PY" -m safetyrepro ...);
# the cell jobs' worker client reads the worker idle timeout from the environment.
shell.prefix(
    f'set -euo pipefail; PY="{sys.executable}"; '
    f"export SAFETYREPRO_WORKER_IDLE_S={PLAN.worker_idle_timeout}; "
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


def cell_inputs(model):
    """An input function for one model's cell rule: item subset, few-shot pool, prepared model."""

    def inputs(wildcards):
        return {
            "subset": rel(PLAN.items_path(wildcards.benchmark)),
            "fewshot": rel(PLAN.fewshot_path(wildcards.benchmark)),
            "model": rel(PLAN.model_marker(model)),
        }

    return inputs


def cell_fingerprint(model, variant):
    """A params function for one model's cell rule (bound here, not in a loop lambda)."""

    def fingerprint(wildcards):
        return PLAN.cell_fingerprint(
            model, wildcards.benchmark, wildcards.config, int(wildcards.seed), variant
        )

    return fingerprint


onstart:
    from safetyrepro.scheduling import drop_local_rate_limiter

    drop_local_rate_limiter(workflow)


onsuccess:
    from safetyrepro.run_summary import finish_run

    finish_run(RESULTS, RUN_T0, ok=True)


onerror:
    from safetyrepro.run_summary import finish_run

    finish_run(RESULTS, RUN_T0, ok=False)
