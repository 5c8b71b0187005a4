"""Where files come from: schemas and the default envelope are package data (config/envelope.yaml
is a link to it, so the two cannot drift), relative paths in a run config resolve against the
config file's folder, and the CLI works from any working directory."""

import fnmatch
import json
import shutil
import tomllib
from pathlib import Path

import yaml

from conftest import ROOT, SHARED_DATA, run_cli
from safetyrepro.config import load_config
from safetyrepro.paths import DATA_DIR, DEFAULT_ENVELOPE, PACKAGE_DIR, SCHEMA_DIR


def test_envelope_and_schemas_are_package_data():
    assert (ROOT / "config" / "envelope.yaml").samefile(DEFAULT_ENVELOPE)
    assert not (ROOT / "config" / "schema").exists()
    assert sorted(p.name for p in SCHEMA_DIR.glob("*.json")) == [
        "config.schema.json", "envelope.schema.json", "task.schema.json"]
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["safetyrepro"]
    for f in DATA_DIR.rglob("*"):
        if f.is_file():
            rel = str(f.relative_to(PACKAGE_DIR))
            assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} is not package data"


def test_relative_paths_follow_the_config_file(tmp_path, monkeypatch):
    run = tmp_path / "study" / "run.yaml"
    run.parent.mkdir()
    shutil.copy(ROOT / "config" / "envelope.yaml", run.parent / "rules.yaml")
    raw = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    raw["envelope"]["rules"] = "rules.yaml"
    raw["data"]["local_dir"] = str(SHARED_DATA)
    raw["runtime"].update(results_dir="out/results", resources_dir="../models")
    run.write_text(yaml.safe_dump(raw))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(run)
    assert Path(cfg.rules.path) == run.parent / "rules.yaml"
    assert cfg.results_dir == run.parent / "out" / "results"
    assert cfg.resources_dir == tmp_path / "models"  # normalized, no '..'
    # the repository's configs point where they did when paths were taken from the checkout
    default = load_config(ROOT / "config" / "config.yaml")
    assert (default.results_dir, default.resources_dir) == (ROOT / "results", ROOT / "resources")
    assert default.data_dir.samefile(SHARED_DATA) and Path(default.rules.path).samefile(DEFAULT_ENVELOPE)


def test_cli_from_another_folder(tmp_path):
    r = run_cli("grid", "--config", str(ROOT / "config" / "paper.yaml"), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cells"] == 612
    r = run_cli("grid", "--config", "config/paper.yaml", cwd=tmp_path)  # relative to the working dir
    assert r.returncode == 2 and r.stderr == "error: config/paper.yaml: file not found\n"
