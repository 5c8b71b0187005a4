"""The Snakefiles pass `snakemake --lint` and `snakefmt --check`, and a dry run of the
default config plans the full grid (no job runs)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*cmd):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_snakemake_lint_clean():
    r = _run(str(BIN / "snakemake"), "--lint", "--configfile", "config/config.yaml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Congratulations, your workflow is in a good condition!" in r.stdout + r.stderr


def test_snakefmt_clean():
    r = _run(str(BIN / "snakefmt"), "--check", "Snakefile", "workflow/rules")
    assert r.returncode == 0, r.stdout + r.stderr


def test_default_dry_run_plans_every_cell(tmp_path):
    import yaml

    cfg = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    cfg["runtime"]["results_dir"] = str(tmp_path / "results")  # empty: everything is planned
    cfg["envelope"]["rules"] = str(ROOT / "config/envelope.yaml")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = _run(str(BIN / "snakemake"), "-n", "--cores", "1", "--resources", "gpu=1", "--quiet", "rules",
             "--directory", str(ROOT), "--configfile", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    counts = {}
    for line in (r.stdout + r.stderr).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    # one rule, `cell`, for every cell job: the 1,764 (model, benchmark, config, seed) jobs of the
    # full envelope and the precision check's 48 (conservative_core: 4 configs x 4 benchmarks x
    # 3 models, greedy)
    assert counts["cell"] == 1764 + 48
    assert counts["prepare_model"] == 3 and counts["items"] == 5 and counts["aggregate"] == 1


def _job_blocks(text):
    """Each 'rule X:' job block of a dry run as (rule, {field: value})."""
    import re

    blocks = []
    for m in re.finditer(r"^rule ([\w.-]+):\n((?:    .*\n)+)", text, flags=re.M):
        fields = dict(line.strip().split(": ", 1) for line in m.group(2).splitlines() if ": " in line)
        blocks.append((m.group(1), fields))
    return blocks


def test_set_resources_cell_key_reaches_every_cell_job(tmp_path):
    """docs/SLURM.md and profiles/slurm tell users to `--set-resources cell:...`: the key
    reaches main and bf16 cells of every model, and priorities keep each model's cells
    together (models in config order, a model's main cells just above its bf16 cells)."""
    import yaml

    cfg = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    cfg["runtime"]["results_dir"] = str(tmp_path / "results")
    cfg["envelope"]["rules"] = str(ROOT / "config/envelope.yaml")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))  # models in config order
    models = list(cfg["models"])
    targets = [str(tmp_path / "results" / root / m / "bbq" / "T1-greedy-k0-freeform" / "s0.parquet")
               for m in models for root in ("shards", "shards_bf16")]
    r = _run(str(BIN / "snakemake"), *targets, "-n", "--cores", "1", "--resources", "gpu=1",
             "--directory", str(ROOT), "--configfile", str(path),
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
