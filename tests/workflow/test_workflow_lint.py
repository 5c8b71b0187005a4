"""The Snakefiles pass `snakemake --lint` and `snakefmt --check`, and a dry run of the
default config plans the full grid (no job runs)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from config_support import config_copy

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*cmd):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def _fresh_run_config(tmp_path, **dump) -> tuple[Path, Path, dict]:
    """The default config with an empty results folder under ``tmp_path`` (so a dry run plans
    everything) and the repository's rules file: (config path, results folder, config)."""
    import yaml

    cfg = config_copy(ROOT / "config/config.yaml")
    results = tmp_path / "results"
    cfg["runtime"]["results_dir"] = str(results)
    cfg["envelope"]["rules"] = str(ROOT / "config/envelope.yaml")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, **dump))
    return path, results, cfg


def test_snakemake_lint_clean():
    r = _run(str(BIN / "snakemake"), "--lint", "--configfile", "config/config.yaml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Congratulations, your workflow is in a good condition!" in r.stdout + r.stderr


def test_snakefmt_clean():
    r = _run(str(BIN / "snakefmt"), "--check", "Snakefile", "workflow/rules")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_default_dry_run_plans_every_cell(tmp_path):
    path, _, _ = _fresh_run_config(tmp_path)
    r = _run(str(BIN / "snakemake"), "-n", "--cores", "1", "--resources", "gpu=1", "--quiet", "rules",
             "--directory", str(ROOT), "--configfile", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    counts = {}
    for line in (r.stdout + r.stderr).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    # the 1,764 (model, benchmark, config, seed) cells of the full envelope: the 1,584 free-form
    # ones as 144 decode-group jobs (3 models x 4 benchmarks x 4 templates x 3 shot counts, 11
    # cells each: greedy, 5 seeds at T=0.3, 5 at T=0.7), the 180 logprob ones (12 configs x 5
    # benchmarks x 3 models) one `cell` job each; also one `cell` job each: the precision check's
    # 54 (conservative_core: 4 configs x 4 benchmarks, and CrowS-Pairs' T1/T2 zero-shot logprob
    # configs, x 3 models, greedy) and, the cross-package stage being on, the nominal config's
    # logprob twin in bf16 for the stage's own bf16 logprob row (4 more benchmarks x 3 models;
    # CrowS-Pairs' is a precision-check config)
    assert counts["cell_group_main"] == 144 and 144 * 11 + 180 == 1764
    assert counts["cell"] == 180 + 54 + 12
    assert counts["prepare_model"] == 3 and counts["items"] == 5 and counts["aggregate"] == 1


def _job_blocks(text):
    """Each 'rule X:' job block of a dry run as (rule, {field: value})."""
    import re

    blocks = []
    # a cell job inside a group job (dry runs show the cluster grouping) is indented by 4
    for m in re.finditer(r"^( *)rule ([\w.-]+):\n((?:\1    .*\n)+)", text, flags=re.M):
        fields = dict(line.strip().split(": ", 1) for line in m.group(3).splitlines() if ": " in line)
        blocks.append((m.group(2), fields))
    return blocks


@pytest.mark.slow
def test_set_resources_cell_key_reaches_every_cell_job(tmp_path):
    """docs/SLURM.md and profiles/slurm tell users to `--set-resources cell:...`: on a cluster
    (a dry run for the Slurm executor, as `--profile profiles/slurm -n` plans) the key reaches
    main and bf16 cells of every model, and priorities keep each model's cells together (models
    in config order, a model's main cells just above its bf16 cells). A local dry run plans the
    main cells as decode-group jobs instead (`cell_group_main`, local runs only)."""
    path, _, cfg = _fresh_run_config(tmp_path, sort_keys=False)  # models in config order
    models = list(cfg["models"])
    targets = [str(tmp_path / "results" / root / m / "bbq" / "T1-greedy-k0-freeform" / "s0.parquet")
               for m in models for root in ("shards", "shards_bf16")]
    r = _run(str(BIN / "snakemake"), *targets, "-n", "--executor", "slurm", "--jobs", "1",
             "--resources", "gpu=1", "--directory", str(ROOT), "--configfile", str(path),
             "--set-resources", "cell:runtime=240", "cell:mem_mb=9000")
    assert r.returncode == 0, r.stdout + r.stderr
    cells = [f for rule, f in _job_blocks(r.stdout + r.stderr) if rule == "cell"]
    assert sorted(f["output"] for f in cells) == sorted(targets)
    priority = {}
    for f in cells:
        res = dict(x.split("=", 1) for x in f["resources"].split(", "))
        assert (res["runtime"], res["mem_mb"], res["gpu"]) == ("240", "9000", "1"), f
        wc = dict(x.split("=", 1) for x in f["wildcards"].split(", "))
        priority[wc["model"], wc["shards"]] = int(f["priority"])
    order = sorted(priority, key=priority.get, reverse=True)
    assert order == [(m, root) for m in models for root in ("shards", "shards_bf16")]
    # locally: each main target's decode group is one job, the bf16 targets stay cells
    r = _run(str(BIN / "snakemake"), *targets, "-n", "--cores", "1", "--resources", "gpu=1",
             "--directory", str(ROOT), "--configfile", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    local = [(rule, f["output"].split(", ")) for rule, f in _job_blocks(r.stdout + r.stderr)
             if rule in ("cell", "cell_group_main")]
    assert sorted((rule, outs[0]) for rule, outs in local) == sorted(
        ("cell_group_main" if "/shards/" in t else "cell", t) for t in targets)
    assert {len(outs) for rule, outs in local if rule == "cell_group_main"} == {11}


@pytest.mark.slow
def test_model_jobs_claim_every_core_of_a_local_run(tmp_path):
    """With `--cores N` (make run passes every core) the jobs that run a model (cells, the
    cross-package stage) claim all N, so no other job runs beside a model, while model
    preparation, items and the tables stay single-core and may pair up; with --cores 1 every
    job is single-core."""
    path, _, _ = _fresh_run_config(tmp_path)
    for cores in (3, 1):
        r = _run(str(BIN / "snakemake"), "-n", "--cores", str(cores), "--resources", "gpu=1",
                 "--directory", str(ROOT), "--configfile", str(path))
        assert r.returncode == 0, r.stdout + r.stderr
        threads: dict[str, set[str]] = {}
        for rule, fields in _job_blocks(r.stdout + r.stderr):
            threads.setdefault(rule, set()).add(fields.get("threads", "1"))
        heavy = {"cell", "cell_group_main", "cross_package"}
        assert heavy <= set(threads), sorted(threads)
        assert {"prepare_model", "items", "aggregate", "figures"} <= set(threads), sorted(threads)
        for rule, seen in threads.items():
            assert seen == {str(cores) if rule in heavy else "1"}, (cores, rule, seen)


@pytest.mark.slow
def test_analysis_rules_declare_what_their_step_writes(tmp_path):
    """Each analysis job of a full dry run declares as outputs exactly the files of the step
    its shell command runs (`safetyrepro analyze <step>`), as safetyrepro.analysis.outputs
    lists them (test_analysis_full checks the steps write exactly those); every step of the
    run appears once, and the figures job reads the tables the figures are drawn from."""
    import re

    from safetyrepro.analysis import outputs
    from safetyrepro.config import load_config
    from safetyrepro.plan import Plan

    path, results, _ = _fresh_run_config(tmp_path)
    plan = Plan(load_config(path))
    assert "bbq-bias" in plan.analysis_steps and "precision" in plan.analysis_steps
    r = _run(str(BIN / "snakemake"), "-n", "-p", "--cores", "1", "--resources", "gpu=1",
             "--directory", str(ROOT), "--configfile", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    tables, figures, cards = results / "tables", results / "figures", results / "cards"
    expected = {step: outputs.table_outputs(step, tables) for step in plan.analysis_steps}
    expected["figures"] = outputs.figure_outputs(figures)
    expected["cards"] = outputs.card_outputs(cards, [(m, b) for m in plan.cfg.models for b in plan.cfg.benchmarks])
    expected["report-md"] = {"report": results / "report.md"}
    # the two table commands that are not `analyze` steps
    expected["rho-flip"] = outputs.rho_flip_outputs(tables)
    expected["cross-package"] = outputs.cross_package_outputs(tables, figures)
    seen = {}
    jobs = re.finditer(r"^rule ([\w.-]+):\n((?:    .*\n)+)Shell command: (.*)\n", r.stdout + r.stderr, flags=re.M)
    for m in jobs:
        step = re.search(r"-m safetyrepro analyze ([\w-]+) ", m.group(3)) or \
            re.search(r"-m safetyrepro (rho-flip|cross-package) ", m.group(3))
        if step is None:
            continue
        fields = dict(line.strip().split(": ", 1) for line in m.group(2).splitlines() if ": " in line)
        assert step.group(1) not in seen, f"two jobs run `analyze {step.group(1)}`"
        seen[step.group(1)] = (m.group(1), set(fields["output"].split(", ")), fields["input"].split(", "))
    assert set(seen) == set(expected)
    for step, (rule, declared, _) in seen.items():
        assert declared == {str(p) for p in expected[step].values()}, (rule, step)
    assert seen["figures"][2] == [str(tables / f"{t}.parquet") for t in outputs.figure_sources()]


def test_conda_deployment_is_refused_before_any_job(tmp_path):
    """envs/ is the rules' declared software for the linter only (jobs run this interpreter's
    environment): a conda deployment is refused with one clear line, not silently half-honoured."""
    r = _run(str(BIN / "snakemake"), "-n", "--cores", "1", "--software-deployment-method", "conda",
             "--configfile", "config/config.yaml")
    assert r.returncode != 0
    assert "--software-deployment-method conda is not supported" in r.stdout + r.stderr


def _jobs_with_commands(text):
    """Each job of a dry run with -p as (rule, {field: value}, its shell command)."""
    jobs, current = [], None
    for line in text.splitlines():
        m = re.match(r"^ *rule ([\w.-]+):$", line)
        if m:
            current = (m.group(1), {})
        elif current and line.startswith("Shell command: "):
            jobs.append((*current, line[len("Shell command: "):]))
            current = None
        elif current and ": " in line.strip():
            k, v = line.strip().split(": ", 1)
            current[1][k] = v
    return jobs


@pytest.mark.slow   # a dry run of the full grid (1,764 cell jobs with their commands)
def test_cell_and_aggregation_commands_pass_only_their_declared_files(tmp_path):
    """The rule is the contract: every file a cell or aggregation command passes is one of its
    job's declared inputs or outputs, and the cell command passes every declared input."""
    import shlex

    path, results, cfg = _fresh_run_config(tmp_path, sort_keys=False)
    shard = str(results / "shards" / "smollm2-135m" / "bbq" / "T1-t0.3-k0-freeform" / "s2.parquet")
    r = _run(str(BIN / "snakemake"), shard, str(results / "tables" / "cell_scores.parquet"), "-n", "-p",
             "--cores", "1", "--resources", "gpu=1", "--directory", str(ROOT), "--configfile", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    jobs = _jobs_with_commands(r.stdout + r.stderr)

    def files(field):
        return {str((ROOT / p).resolve()) for p in field.split(", ")}

    def passed(cmd, flags):
        argv = shlex.split(cmd.split(" > ")[0])
        return {flag: str((ROOT / argv[argv.index(flag) + 1]).resolve()) for flag in flags}

    # the shard's decode group is one job: every --out is a declared output, in order
    (cell,) = [(f, cmd) for rule, f, cmd in jobs if rule == "cell_group_main" and shard in f["output"].split(", ")]
    fields, cmd = cell
    paths = passed(cmd, ("--config", "--rules", "--items", "--fewshot", "--model-marker"))
    assert set(paths.values()) == files(fields["input"])
    argv = shlex.split(cmd.split(" > ")[0])
    outs = [str((ROOT / argv[i + 1]).resolve()) for i, a in enumerate(argv) if a == "--out"]
    assert outs == [str((ROOT / p).resolve()) for p in fields["output"].split(", ")] and shard in outs
    ids = [argv[i + 1] for i, a in enumerate(argv) if a == "--config-id"]
    seeds = [argv[i + 1] for i, a in enumerate(argv) if a == "--seed"]
    assert [f"{c}/s{k}" for c, k in zip(ids, seeds)] == [o.split("/")[-2] + "/" + o.split("/")[-1][:-8] for o in outs]
    assert ids == ["T1-greedy-k0-freeform"] + ["T1-t0.3-k0-freeform"] * 5 + ["T1-t0.7-k0-freeform"] * 5
    assert paths["--config"] == str(path) and "--decode-group greedy:1,t0.3:5,t0.7:5" in cmd

    (agg,) = [(f, cmd) for rule, f, cmd in jobs if rule == "aggregate"]
    fields, cmd = agg
    paths = passed(cmd, ("--config", "--inputs", "--out-dir"))
    declared = files(fields["input"])
    assert paths["--config"] in declared and paths["--inputs"] in declared
    assert paths["--inputs"] == str(results / "aggregate" / "inputs_main.json")
    assert {os.path.dirname(p) for p in files(fields["output"])} == {paths["--out-dir"]}
    # the list the aggregation job reads is written from exactly the declared shards and items
    (listing,) = [f for rule, f, _ in jobs if rule == "aggregate_inputs"]
    assert files(listing["input"]) - declared == {str(results / "models" / f"{m}.json") for m in cfg["models"]}
    assert declared - files(listing["input"]) == {paths["--config"], paths["--inputs"],
                                                   str((ROOT / "config" / "envelope.yaml").resolve())}
