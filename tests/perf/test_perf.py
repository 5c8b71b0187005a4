"""Benchmark helpers (safetyrepro.perf): alternating timing, tables, machine record, and the
workloads (real items rendered exactly as a cell renders them)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from safetyrepro.config import load_config
from safetyrepro.paths import PROJECT_ROOT
from safetyrepro.perf.machine import ISA_FLAGS, cpu_id, cpu_isa, describe, machine_info, peak_rss_mib
from safetyrepro.perf.report import publish, save
from safetyrepro.perf.timing import alternate, format_table
from safetyrepro.perf.workload import freeform_prompts, load_workload, logprob_requests
from safetyrepro.provenance import code_version


def test_alternate_runs_sides_in_turn_and_reports_ratios():
    calls = []

    def side(name, secs):
        def run():
            calls.append(name)
            time.sleep(secs)
            return name
        return run

    t = alternate({"fast": side("fast", 0.01), "slow": side("slow", 0.05)}, 3, log=None)
    assert calls == ["fast", "slow"] * 3
    assert len(t.times["fast"]) == len(t.times["slow"]) == 3
    assert t.results == {"fast": "fast", "slow": "slow"}
    assert 2.0 < t.ratio("slow", "fast") < 10.0
    assert all(r > 1.5 for r in t.paired_ratios("slow", "fast"))
    with pytest.raises(ValueError):
        alternate({"a": lambda: None}, 0)


def test_format_table():
    out = format_table(["a", "bb"], [["x", 1.234], ["yy", 0.0123]]).splitlines()
    assert out[0] == "| a  | bb     |"
    assert out[1] == "|----|--------|"
    assert out[2] == "| x  | 1.23   |" and out[3] == "| yy | 0.0123 |"


def test_machine_record_and_saved_json(tmp_path):
    info = machine_info()
    assert info["cores"] >= 1 and info["torch_threads"] >= 1 and len(info["loadavg"]) == 3
    assert "torch" in describe(info) and peak_rss_mib() > 10
    # the CPU named beyond a VM's bare model name: one token per instruction set, present or "-"
    assert len(info["cpu_isa"].split()) == len(ISA_FLAGS) and info["cpu_isa"] in describe(info)
    assert cpu_isa(frozenset({"avx2", "avx512_bf16"})) == "avx2 -avx512f avx512_bf16 -amx_bf16"


def test_cpu_id_reads_family_and_model(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
                 "model name\t: AMD EPYC\n\nprocessor\t: 1\ncpu family\t: 99\n")
    assert cpu_id(str(f)) == "family 25 model 1"
    f.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")   # Arm: no family line
    assert cpu_id(str(f)) is None and cpu_id(str(tmp_path / "none")) is None
    path = save("unit", {"x": 1}, out_dir=tmp_path)
    rec = json.loads(path.read_text())
    assert rec["benchmark"] == "unit" and rec["x"] == 1 and rec["machine"]["cpu"]
    assert rec["command"]
    assert rec["code_version"]["source_sha256"] == code_version()["source_sha256"]


def test_publish_prints_the_table_and_saves_it_with_the_payload(tmp_path, capsys):
    path = publish("unit2", ["a", "b"], [["x", 1.5]], {"records": [1]}, out_dir=tmp_path, note="n=1")
    out = capsys.readouterr().out
    rec = json.loads(path.read_text())
    assert "| x | 1.50 |" in out and "machine: " in out and out.rstrip().endswith(str(path))
    assert "; n=1" in out
    assert rec["records"] == [1] and rec["table"] in out and rec["benchmark"] == "unit2"


@pytest.fixture(scope="module")
def cfg():
    return load_config(PROJECT_ROOT / "config" / "config.yaml")


@pytest.fixture(scope="module")
def tok(cfg):
    from transformers import AutoTokenizer

    from safetyrepro.models.prepare import prepare_model

    return AutoTokenizer.from_pretrained(str(prepare_model(cfg, "smollm2-135m", progress=False)))


def test_workload_uses_the_run_subset_rules_and_cell_rendering(cfg, tok, shared_data, tmp_path):
    from safetyrepro.items import build_items
    from safetyrepro.models import format_prompt
    from safetyrepro.tasks import load_task

    wl = load_workload(cfg, "truthfulqa", 30)
    assert len(wl.items) == 30 and len({it["item_id"] for it in wl.items}) == 30
    assert len(wl.fewshot) == 5 and not {x["item_id"] for x in wl.fewshot} & {it["item_id"] for it in wl.items}
    # at the config's own size it is exactly the run's subset
    small = load_workload(cfg, "truthfulqa", cfg.benchmark("truthfulqa")["n_items"])
    assert small.subset_hash == build_items(cfg, "truthfulqa", out_dir=tmp_path)["subset_hash"]
    assert small.subset_hash != wl.subset_hash
    lm = SimpleNamespace(tokenizer=tok)
    task = load_task("truthfulqa")
    prompts = freeform_prompts(cfg, lm, wl, "T2-greedy-k3-freeform")
    assert prompts[4] == format_prompt(tok, task.build_messages(wl.items[4], "T2", wl.fewshot[:3]))
    ctx, cands = logprob_requests(cfg, lm, wl, "T1-greedy-k0-logprob")
    messages, candidates = task.logprob_request(wl.items[7], "T1", [])
    assert ctx[7] == format_prompt(tok, messages) and cands[7] == list(candidates)
    assert len(ctx) == len(cands) == 30


def test_shared_benchmark_arguments_import_nothing_heavy_and_keep_their_defaults():
    import subprocess
    import sys

    # a benchmark script's --help must not load torch or the models
    code = ("import sys; import safetyrepro.perf.args; "
            "sys.exit(1 if {'torch', 'safetyrepro.perf.workload'} & set(sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    from safetyrepro.perf.args import add_generation_args, bench_parser, cell_bench_parser, decode_group_parser

    a = decode_group_parser("Doc line.\n\nMore.", ["m:b:T1:k0"]).parse_args([])
    assert (a.config, a.cases, a.rounds, a.out) == ("config/config.yaml", ["m:b:T1:k0"], 2, None)
    a = cell_bench_parser("Doc.", ["T1-greedy-k0-freeform"]).parse_args(["--threads", "1"])
    assert (a.benchmark, a.cells, a.threads) == ("truthfulqa", ["T1-greedy-k0-freeform"], 1)
    a = add_generation_args(bench_parser("Doc.")).parse_args(["--dtype", "bf16"])
    assert (a.rounds, a.batch_size, a.dtype, a.threads) == (1, 16, "bf16", 1)
    assert decode_group_parser("First paragraph.\n\nSecond.", []).description == "First paragraph."


def test_slice_decode_groups_name_the_default_runs_models_and_benchmarks(cfg):
    """Benchmarks 20 and 21 time the slice's decode groups: every case names a model and a
    benchmark of the default config and a template and shots of its rules, three per model."""
    from safetyrepro.perf.args import SLICE_DECODE_GROUPS

    templates = {lv["id"] for lv in cfg.rules.levels("template")}
    shots = {lv["id"] for lv in cfg.rules.levels("shots")}
    models = [case.split(":")[0] for case in SLICE_DECODE_GROUPS]
    assert sorted(set(models)) == sorted(cfg.models) and all(models.count(m) == 3 for m in cfg.models)
    for case in SLICE_DECODE_GROUPS:
        _, bench, template, k = case.split(":")
        assert bench in cfg.benchmarks and template in templates and k in shots


def test_cell_bench_setup_names_the_missing_items_and_the_command(tmp_path):
    import yaml

    from config_support import config_copy
    from safetyrepro.perf.workload import cell_bench_setup

    cfg = config_copy(PROJECT_ROOT / "config" / "config.yaml")
    cfg["runtime"]["results_dir"] = str(tmp_path / "results")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(FileNotFoundError, match=r"items.*truthfulqa.*is missing: run `safetyrepro items --config"):
        cell_bench_setup(str(path), "truthfulqa")
