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
    main_cells = sum(v for k, v in counts.items() if k.startswith("cell_") and not k.startswith("cell_bf16_"))
    bf16_cells = sum(v for k, v in counts.items() if k.startswith("cell_bf16_"))
    assert main_cells == 1764  # every (model, benchmark, config, seed) job of the full envelope
    assert bf16_cells == 48    # conservative_core (4 configs x 4 benchmarks x 3 models), greedy
    assert counts["prepare_model"] == 3 and counts["items"] == 5 and counts["aggregate"] == 1
