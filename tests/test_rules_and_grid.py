import json
from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from config_support import config_copy
from safetyrepro import grid
from safetyrepro.config import load_config
from safetyrepro.errors import ConfigError
from safetyrepro.rules import load_rules


def test_paper_grid_counts():
    cfg = load_config("config/paper.yaml")
    s = grid.summarize_config(cfg)
    for b in ("truthfulqa", "bbq", "toxigen", "xstest"):
        assert s["benchmarks"][b] == {"configs": 48, "freeform": 36, "logprob": 12, "jobs_per_model": 144}
    assert s["benchmarks"]["crows_pairs"]["configs"] == 12
    assert s["benchmarks"]["crows_pairs"]["freeform"] == 0
    assert s["cells"] == 612
    assert s["jobs"] == 1764
    assert len(grid.config_jobs(cfg)) == 1764
    assert len({j.id for j in grid.config_jobs(cfg)}) == 1764  # ids unique


def test_grid_cli_prints_counts_and_stamp():
    r = run_cli("grid", "--config", "config/paper.yaml")
    assert r.returncode == 0, r.stderr
    assert "cells: 612" in r.stdout and "jobs:  1764" in r.stdout
    assert load_rules().stamp in r.stdout
    j = json.loads(run_cli("grid", "--config", "config/paper.yaml", "--json").stdout)
    assert j["cells"] == 612 and j["rules_stamp"] == load_rules().stamp


def test_validity_rules_are_applied():
    rules = load_rules()
    for b in rules.benchmarks:
        for c in grid.configs(rules, b):
            if c.scoring == "logprob":
                assert c.decoding == "greedy"
            if b == "crows_pairs":
                assert c.scoring == "logprob"
    assert rules.violations("crows_pairs", {"template": "T1", "decoding": "greedy", "shots": "k0",
                                            "scoring": "freeform"}) == ["crows-logprob-only"]


def test_sub_envelopes():
    rules = load_rules()
    core = grid.configs(rules, "bbq", "core")
    assert core and all(c.template != "T4" and c.decoding != "t0.7" for c in core)
    assert all(grid.is_core(rules, c) for c in core)
    # full minus core = exactly the configs touching a stress level
    full = grid.configs(rules, "bbq", "full")
    assert {c for c in full if not grid.is_core(rules, c)} == set(full) - set(core)
    cons = grid.configs(rules, "bbq", "conservative_core")
    assert [c.id for c in cons] == ["T1-greedy-k0-freeform", "T1-greedy-k3-freeform",
                                    "T2-greedy-k0-freeform", "T2-greedy-k3-freeform"]


def test_config_id_roundtrip():
    c = grid.Config("T2", "t0.3", "k3", "freeform")
    assert c.id == "T2-t0.3-k3-freeform"
    assert grid.Config.parse(c.id) == c
    with pytest.raises(ValueError):
        grid.Config.parse("T2-t0.3")


def test_config_of_looks_ids_up_in_the_rules_levels():
    rules = load_rules()
    c = grid.config_of(rules, "T2-t0.3-k3-freeform")
    assert c == grid.Config("T2", "t0.3", "k3", "freeform") and c is grid.config_index(rules)[c.id]
    # every config the levels form, valid for some benchmark or not (T4 logprob is invalid)
    assert grid.config_of(rules, "T4-t0.7-k5-logprob").levels()["decoding"] == "t0.7"
    for bad in ("T9-greedy-k0-freeform", "T1-greedy-k0", "T1-greedy-k7-logprob"):
        with pytest.raises(ValueError, match=str(rules.path)):
            grid.config_of(rules, bad)


def _write_rules(tmp_path: Path, content: dict) -> Path:
    p = tmp_path / "envelope.yaml"
    p.write_text(yaml.safe_dump(content))
    return p


def test_stamp_ignores_comments_and_key_order(tmp_path, project_root):
    original = (project_root / "config/envelope.yaml").read_text()
    content = yaml.safe_load(original)
    reordered = dict(reversed(list(content.items())))
    p = tmp_path / "a.yaml"
    p.write_text("# a different comment\n" + yaml.safe_dump(reordered, sort_keys=False))
    assert load_rules(p).stamp == load_rules().stamp


def test_stamp_changes_with_content(tmp_path, project_root):
    content = yaml.safe_load((project_root / "config/envelope.yaml").read_text())
    content["seeds"]["sampled"] = 3
    assert load_rules(_write_rules(tmp_path, content)).stamp != load_rules().stamp
    content = yaml.safe_load((project_root / "config/envelope.yaml").read_text())
    content["axes"]["shots"][2]["tier"] = "stress"
    assert load_rules(_write_rules(tmp_path, content)).stamp != load_rules().stamp


@pytest.mark.parametrize("mutate, field", [
    (lambda c: c["axes"]["template"][0].update(tier="extreme"), "axes.template.0.tier"),
    (lambda c: c["axes"].pop("shots"), "axes"),
    (lambda c: c["validity"][0]["require"].update(decoding=["t9"]), "validity.0.require.decoding"),
    (lambda c: c["axes"]["decoding"][1].update(temperature=0.0), "axes.decoding.1"),
    (lambda c: c["sub_envelopes"]["core"].update(exclude_tiers=["core", "heavy"]), "sub_envelopes.core.exclude_tiers.1"),
])
def test_bad_rules_name_file_and_field(tmp_path, project_root, mutate, field):
    content = yaml.safe_load((project_root / "config/envelope.yaml").read_text())
    mutate(content)
    p = _write_rules(tmp_path, content)
    with pytest.raises(ConfigError) as ei:
        load_rules(p)
    assert str(p) in str(ei.value)
    assert ei.value.field == field


@pytest.mark.parametrize("mutate, field", [
    (lambda c: c["benchmarks"]["bbq"].update(n_items="many"), "benchmarks.bbq.n_items"),
    (lambda c: c["benchmarks"].update(mmlu={"n_items": 3}), "benchmarks"),
    (lambda c: c["models"]["smollm2-135m"].update(quantization="int3"), "models.smollm2-135m.quantization"),
    (lambda c: c["envelope"].update(name="tiny"), "envelope.name"),
    (lambda c: c.pop("models"), "(top level)"),
    (lambda c: c["analysis"].update(alpha=1.0), "analysis.alpha"),
    # the scale probe's families: [small, large] pairs of distinct configured models with a third model
    (lambda c: c["analysis"].update(scale_probe={"families": [["smollm2-135m"]]}), "analysis.scale_probe.families.0"),
    (lambda c: c["analysis"].update(scale_probe={"families": []}), "analysis.scale_probe.families"),
    (lambda c: c["analysis"].update(scale_probe={"family": [["smollm2-135m", "qwen2.5-0.5b"]]}), "analysis.scale_probe"),
    (lambda c: c["analysis"].update(scale_probe={"families": [["smollm2-135m", "nope"]]}),
     "analysis.scale_probe.families.0"),
    (lambda c: c["analysis"].update(scale_probe={"families": [["smollm2-135m", "smollm2-135m"]]}),
     "analysis.scale_probe.families.0"),
    (lambda c: c["analysis"].update(scale_probe={"families": [["smollm2-135m", "qwen2.5-0.5b"]] * 2}),
     "analysis.scale_probe.families.1"),
    (lambda c: (c["models"].pop("gemma3-270m"), c["analysis"].update(
        scale_probe={"families": [["smollm2-135m", "qwen2.5-0.5b"]]})), "analysis.scale_probe.families.0"),
    # model keys name folders (shards/<key>/...): "." and ".." would escape shards/
    (lambda c: c["models"].update({"..": c["models"]["smollm2-135m"]}), "models"),
    (lambda c: c["models"].update({".": c["models"]["smollm2-135m"]}), "models"),
    # gguf_name is a file name under resources/ (deleted after conversion), never a path
    (lambda c: c["models"]["smollm2-135m"]["source"].update(gguf_name="../../victim.gguf"),
     "models.smollm2-135m.source.gguf_name"),
    (lambda c: c["models"]["smollm2-135m"]["source"].update(gguf_name="/etc/x.gguf"),
     "models.smollm2-135m.source.gguf_name"),
])
def test_bad_config_names_file_and_field(tmp_path, project_root, mutate, field):
    content = config_copy(project_root / "config/config.yaml")
    mutate(content)
    p = tmp_path / "config.yaml"
    p.write_text(yaml.safe_dump(content))
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert str(p) in str(ei.value)
    assert ei.value.field == field


def test_bad_config_cli_exit_2(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("run_name: x\nenvelope: {rules: config/envelope.yaml}\nbenchmarks: {}\nmodels: {}\n")
    r = run_cli("grid", "--config", str(p))
    assert r.returncode == 2
    assert str(p) in r.stderr and "should be non-empty" in r.stderr and "field " in r.stderr


def test_analysis_alpha_default(tmp_path, project_root):
    content = config_copy(project_root / "config/config.yaml")
    content["analysis"].pop("alpha")
    p = tmp_path / "config.yaml"
    p.write_text(yaml.safe_dump(content))
    assert load_config(p).section("analysis")["alpha"] == 0.05
    assert load_config(project_root / "config/paper.yaml").section("analysis")["alpha"] == 0.05
