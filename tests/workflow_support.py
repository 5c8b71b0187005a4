"""Helpers for tests that run the real Snakemake workflow on a copy of the project.

The copy lets a test edit a parser, a template or the rules file without touching the
checkout; its jobs import the copy's package (PYTHONPATH), read the shared benchmark data and
reuse the checkout's prepared models (resources/)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from config_support import config_copy

ROOT = Path(__file__).resolve().parents[1]
DATA = (ROOT.parent / "shared" / "data" / "benchmarks").resolve()
TINY = ROOT / "tests" / "configs" / "tiny.yaml"


def project_files() -> list[str]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    return [f for f in out if f and (ROOT / f).is_file()]


def make_project_copy(dest: Path, config_over: dict | None = None) -> tuple[Path, Path]:
    """Copy the project to ``dest``; write the tiny config there with absolute data/resources
    paths and results under ``dest/results``. Returns (project dir, config path)."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in project_files():
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, target)
    cfg = yaml.safe_load(TINY.read_text())
    cfg["data"]["local_dir"] = str(DATA)
    cfg["runtime"]["resources_dir"] = str(ROOT / "resources")
    cfg["runtime"]["results_dir"] = str(dest / "results")
    for k, v in (config_over or {}).items():
        cfg[k] = v
    path = dest / "tests" / "configs" / "run.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return dest, path


def benchmark_script(name: str):
    """``benchmarks/<name>.py`` imported as a module (the scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def env_for(project: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(project / "src")
    env.pop("SAFETYREPRO_DATA", None)
    return env


def snakemake(project: Path, config: Path, *args: str, timeout: int = 1200,
              popen: bool = False):
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(project / "Snakefile"),
           "--directory", str(project), "--configfile", str(config), "--cores", "1",
           "--resources", "gpu=1", "--profile", str(project / "profiles" / "default"), *args]
    if popen:
        return subprocess.Popen(cmd, env=env_for(project), cwd=project, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return subprocess.run(cmd, env=env_for(project), cwd=project, capture_output=True, text=True,
                          timeout=timeout)


def planned(project: Path, config: Path, *args: str) -> tuple[dict[str, int], set[str]]:
    """Dry-run: (job count per rule, set of planned output paths relative to the project);
    ``args`` are further Snakemake arguments (targets, ``--allowed-rules`` ...)."""
    r = snakemake(project, config, "-n", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    text = r.stdout + r.stderr
    counts: dict[str, int] = {}
    outputs: set[str] = set()
    # a job inside a group job (the cell rule's per-model groups) is printed indented
    for m in re.finditer(r"^([ ]*)rule ([\w.-]+):\n((?:\1    .*\n)+)", text, flags=re.M):
        counts[m.group(2)] = counts.get(m.group(2), 0) + 1
        for line in m.group(3).splitlines():
            line = line.strip()
            if line.startswith("output:"):
                for p in line[len("output:"):].split(","):
                    p = p.strip()
                    if p:
                        outputs.add(str(Path(p).relative_to(project)) if p.startswith(str(project)) else p)
    return counts, outputs


def cell_rules(counts: dict[str, int]) -> dict[str, int]:
    """The job counts of the rules that run cells: ``cell`` and the decode groups'
    ``cell_group_<variant>``."""
    return {k: v for k, v in counts.items() if k == "cell" or k.startswith("cell_group_")}


def cli(project: Path, *args: str, timeout: int = 600):
    """`python -m safetyrepro ...` with the copy's package (what its jobs run)."""
    return subprocess.run([sys.executable, "-m", "safetyrepro", *args], env=env_for(project), cwd=project,
                          capture_output=True, text=True, timeout=timeout)


def smol_truthfulqa_config(tmp_path: Path) -> tuple[Path, Path]:
    """The embedded SmolLM2 prepared, and a copy of the default config with it as the only
    model and TruthfulQA (300 items) as the only benchmark (the GPU scripts' CPU modes).
    Returns (the model folder, the config path)."""
    from safetyrepro.config import load_config
    from safetyrepro.models import prepare_model

    folder = prepare_model(load_config(ROOT / "config" / "config.yaml"), "smollm2-135m", progress=False)
    cfg = config_copy(ROOT / "config" / "config.yaml")
    cfg["models"] = {"smollm2-135m": cfg["models"]["smollm2-135m"]}
    cfg["benchmarks"] = {"truthfulqa": {"n_items": 300}}
    cfg["data"]["local_dir"] = str(DATA)
    cfg["runtime"].update(resources_dir=str(ROOT / "resources"), results_dir=str(tmp_path / "results"))
    path = tmp_path / "smol_truthfulqa.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return Path(folder), path
