# Shared set-up: validate the config against the package schema (src/safetyrepro/data/schema), build the plan, and define the
# input functions and wildcard constraints every other rule file uses.
import os
import re
import shlex
import sys
import time
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

from safetyrepro.cell_request import format_decode_group
from safetyrepro.config import config_from_dict, load_config
from safetyrepro.errors import SafetyReproError
from safetyrepro.analysis import outputs as analysis_outputs
from safetyrepro.plan import Plan
from safetyrepro.results_layout import (
    SHARD_PATTERN,
    SHARD_ROOTS,
    aggregate_outputs as layout_aggregate_outputs,
    variant_of_shard_root,
)
from safetyrepro.sysutil import hostname

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
    from safetyrepro.worker.lifecycle import own_allocation_workers

    own_allocation_workers(PLAN.layout.worker_state_root)


def rel(path):
    """Paths under the working directory are given relative to it, so targets such as
    `snakemake results/tables/cell_scores.parquet` match the rules' outputs."""
    path = os.path.abspath(path)
    inside = os.path.commonpath([path, os.getcwd()]) == os.getcwd()
    return os.path.relpath(path) if inside else path


# Jobs that compute with torch on every core (the cells' model workers, the cross-package
# stage) claim all of --cores on a local run, so that with `--cores N` (make run: every core)
# only single-core jobs (model preparation, items, the tables) run side by side and never
# beside a model. On a cluster each job asks for its own CPUs (profiles/slurm), so 1 there.
def _whole_machine():
    if not workflow.local_exec:
        return 1
    try:
        return int(workflow.cores)
    except (WorkflowError, TypeError, ValueError):
        return 1  # no --cores given


WHOLE_MACHINE = _whole_machine()
RESULTS = rel(PLAN.layout.results)
CONFIG = rel(CONFIG_PATH)
RULES = rel(RUN.rules.path)  # the envelope rules file the config names
# Each rule's `conda:` names the software it runs (envs/safetyrepro.yaml) for the linter; jobs
# run in this interpreter's environment, so a conda deployment would install an unused copy.
ENV = "../../envs/safetyrepro.yaml"
if any(m.name == "CONDA" for m in workflow.deployment_settings.deployment_method):
    sys.exit(
        "error: --software-deployment-method conda is not supported: every job runs the "
        "interpreter that runs Snakemake; install the project into it (make install)"
    )

# Every job runs the package in this interpreter's environment ("$PY" -m safetyrepro ...).
# Every path and value a rule's shell command interpolates is shell-quoted ({x:q}), so a
# results folder with a space (or a value holding "$(...)") is one argument, never code.
# RUN_ID names this invocation to the model workers (the end-of-run cleanup stops only the
# workers no other run is using); an environment variable, not a param, so it never reruns a job.
RUN_ID = f"run-{hostname()}-{os.getpid()}-{int(time.time())}"
shell.prefix(
    f"set -euo pipefail; PY={shlex.quote(sys.executable)}; "
    f"export SAFETYREPRO_RUN_ID={RUN_ID}; "
)


wildcard_constraints:
    model="|".join(re.escape(m) for m in RUN.models),
    benchmark="|".join(RUN.benchmarks),
    config_id=r"T[0-9A-Za-z.]+-[0-9A-Za-z.]+-k[0-9]+-(freeform|logprob)",
    seed=r"[0-9]+",


def all_targets():
    targets = [
        f"{RESULTS}/tables/cell_scores.parquet",
        str(analysis_outputs.rho_flip_outputs(TABLES)["pairs"]),
    ]
    targets += analysis_targets() + CROSS_PACKAGE_TABLES
    return targets


TABLES = f"{RESULTS}/tables"


def aggregate_outputs(variant):
    """The aggregation step's outputs, as the package names them."""
    return {k: rel(v) for k, v in layout_aggregate_outputs(TABLES, variant).items()}


def write_aggregate_inputs(path, variant, declared, log_path):
    """Write what the aggregation job of `variant` reads (safetyrepro.aggregate_inputs.write_inputs:
    each shard with the fingerprint the plan expects, and the item files), after checking that
    it names exactly the files `declared` (the rule's input)."""
    from safetyrepro.aggregate_inputs import write_inputs

    inputs = PLAN.aggregate_inputs(variant)
    listed = [e.path for e in inputs.shards] + list(inputs.items.values())
    given = list(declared.shards) + list(declared.item_files)
    if sorted(map(os.path.abspath, listed)) != sorted(map(os.path.abspath, given)):
        raise SafetyReproError(
            f"the aggregation inputs of {variant} differ from the rule's declared inputs"
        )
    write_inputs(path, inputs)
    Path(log_path).write_text(
        f"{len(inputs.shards)} shard(s), {len(inputs.items)} item file(s) -> {path}\n"
    )


# The analysis steps' outputs, as the package names them (safetyrepro.analysis.outputs):
# the rules declare exactly what each step writes.
CARDS = f"{RESULTS}/cards"
FIGURES_DIR = f"{RESULTS}/figures"
REPORT_CATEGORY = {
    "tables": "Tables",
    "significance": "Significance",
    "nearest-reversal": "Significance",
    "variance": "Variance",
    "robustness": "Robustness",
    "subsample": "Robustness",
    "bbq-bias": "Robustness",
    "precision": "Robustness",
    "scale-probe": "Robustness",
}


def table_outputs(step):
    """A table step's outputs: each table's Parquet file and its CSV (in the HTML report,
    captioned by workflow/report/<table>.rst)."""
    out = {}
    for name, path in analysis_outputs.table_outputs(step, TABLES).items():
        table = name.removesuffix("_csv")
        if name == table:
            out[name] = str(path)
        else:
            caption = f"../report/{table}.rst"
            out[name] = report(
                str(path), caption=caption, category=REPORT_CATEGORY[step]
            )
    return out


def step_tables(steps):
    """The Parquet tables the given table steps write, in step order."""
    return [
        f"{TABLES}/{t}.parquet" for s in steps for t in analysis_outputs.step_tables(s)
    ]


def figure_outputs():
    return {k: str(v) for k, v in analysis_outputs.figure_outputs(FIGURES_DIR).items()}


def card_outputs():
    """The cards step's outputs: every card (JSON and Markdown, one per model and
    benchmark) and the index."""
    pairs = [(m, b) for m in RUN.models for b in RUN.benchmarks]
    return {k: str(p) for k, p in analysis_outputs.card_outputs(CARDS, pairs).items()}


def report_tables():
    """The tables report.md shows (safetyrepro.analysis.outputs.REPORT_TABLES) that this run
    computes."""
    computed = set(step_tables(PLAN.analysis_steps) + CROSS_PACKAGE_TABLES)
    tables = (f"{TABLES}/{n}.parquet" for n in analysis_outputs.REPORT_TABLES)
    return [t for t in tables if t in computed]


def analysis_targets():
    targets = step_tables(PLAN.analysis_steps)
    targets += list(card_outputs().values()) + [f"{RESULTS}/report.md"]
    targets += list(figure_outputs().values())
    return targets


ANALYSIS = RUN.section("analysis")
# The cross-package stage scores the benchmarks that lm-eval or Inspect have tasks for.
CROSS_PACKAGE_BENCHMARKS = [
    b for b in RUN.benchmarks if b in ("truthfulqa", "bbq", "crows_pairs")
]
CROSS_PACKAGE = bool(ANALYSIS.get("cross_package")) and bool(CROSS_PACKAGE_BENCHMARKS)
CROSS_PACKAGE_OUTPUTS = {
    k: str(p)
    for k, p in analysis_outputs.cross_package_outputs(TABLES, FIGURES_DIR).items()
}
CROSS_PACKAGE_TABLES = [CROSS_PACKAGE_OUTPUTS["table"]] if CROSS_PACKAGE else []
# the scale probe's table, for the cards, when the config declares analysis.scale_probe
SCALE_PROBE_TABLES = (
    [f"{TABLES}/scale_probe.parquet"] if "scale-probe" in PLAN.analysis_steps else []
)


def cell_variant(wildcards):
    """The variant of a cell job, from its shard folder (main: shards/, bf16: shards_bf16/)."""
    return variant_of_shard_root(wildcards.shards)


def cell_quantization(wildcards):
    return PLAN.quantization(wildcards.model, cell_variant(wildcards))


PROGRESS = []


onstart:
    from safetyrepro.models.load import require_device
    from safetyrepro.progress import RunProgress, planned_shards
    from safetyrepro.run_summary import start_run
    from safetyrepro.scheduling import drop_local_rate_limiter
    from safetyrepro.sysutil import compile_bytecode
    from safetyrepro.runlock import hold_results_lock

    # a config that needs a GPU (runtime.device: cuda) fails here, before any job starts
    # (a dry run, -n, skips onstart and so plans without a GPU); so does a results folder
    # another live run is using (safetyrepro.runlock; held until this process exits)
    try:
        hold_results_lock(PLAN.layout.results, RUN_ID, CONFIG_PATH)
        require_device(RUN)
    except SafetyReproError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    drop_local_rate_limiter(workflow)
    # every job imports the package: its bytecode once here, not in each of ~1,800 jobs
    # where Python writes none itself (PYTHONDONTWRITEBYTECODE)
    compile_bytecode()
    start_run(RESULTS, RUN_ID)
    # a line a minute: cells done and the time left, estimated from the cells done so far
    PROGRESS.append(RunProgress(PLAN.layout.results, planned_shards(PLAN)).start())


onsuccess:
    from safetyrepro.run_summary import finish_run

    for p in PROGRESS:
        p.stop()
    finish_run(RESULTS, RUN_T0, ok=True, run_id=RUN_ID)


onerror:
    from safetyrepro.run_summary import finish_run

    for p in PROGRESS:
        p.stop()
    finish_run(RESULTS, RUN_T0, ok=False, snakemake_log=log, run_id=RUN_ID)


# The decode groups' jobs (workflow/rules/cells.smk, `cell_group_<variant>`).
def group_cell_args(wildcards, variant):
    """The repeated per-cell options of a group job's client: each member's config id, seed,
    planned fingerprint and shard, in the order of the rule's outputs. Computed from the
    wildcards alone, not from the job's outputs: Snakemake leaves params derived from a job's
    outputs out of its params rerun trigger, and these carry the fingerprints."""
    cells = PLAN.group_cells(
        variant,
        wildcards.model,
        wildcards.benchmark,
        wildcards.template,
        wildcards.shots,
    )
    return " ".join(
        f"--config-id {shlex.quote(c)} --seed {s} --fingerprint {fp} --out "
        + shlex.quote(
            rel(
                PLAN.layout.shard_path(
                    wildcards.model, wildcards.benchmark, c, s, variant
                )
            )
        )
        for c, s, fp in cells
    )
