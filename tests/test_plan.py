"""The plan on its own (no model, no Snakemake): paths, variants, decode groups, priorities and
fingerprints, including a config with one model configured as bf16."""

from __future__ import annotations

import pytest
import yaml

from safetyrepro.config import load_config
from safetyrepro.fingerprints import cell_fingerprint, cell_fingerprint_fields, loaded_weights_identity
from safetyrepro.plan import Plan
from safetyrepro.results_layout import SHARD_ROOTS, variant_of_shard_root
from workflow_support import ROOT
from config_support import config_copy


def _plan(tmp_path, models: dict[str, str], precision_check=True, seeds=None, cross_package=False,
          nominal=None) -> Plan:
    cfg = config_copy(ROOT / "config/config.yaml")
    source = next(iter(cfg["models"].values()))["source"]
    cfg["models"] = {m: {"display_name": m, "quantization": q, "source": source} for m, q in models.items()}
    cfg["envelope"]["rules"] = str(ROOT / "config/envelope.yaml")
    cfg["analysis"]["precision_check"] = precision_check
    cfg["analysis"]["cross_package"] = cross_package
    if nominal:
        cfg["analysis"]["nominal_config"] = nominal
    if seeds:
        cfg["envelope"]["seeds"] = seeds
    cfg["runtime"]["results_dir"] = str(tmp_path / "results")
    path = tmp_path / f"c{len(list(tmp_path.glob('c*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return Plan(load_config(path))


def test_one_bf16_model_gets_its_own_precision_check_cells(tmp_path):
    plan = _plan(tmp_path, {"a": "nf4", "b": "bf16"})
    assert plan.precision_check
    assert [plan.quantization(m, v) for m in "ab" for v in SHARD_ROOTS] == ["nf4", "bf16", "bf16", "bf16"]
    cell = "T1-greedy-k0-freeform"
    # main: the greedy cell is decoded with the sampled decodings of its template and shots
    assert plan.decode_group("bbq", cell, "main") == (("greedy", 1), ("t0.3", 5), ("t0.7", 5))
    # bf16 (conservative_core has no sampled decoding): alone, so its own fingerprint
    assert plan.decode_group("bbq", cell, "bf16") == (("greedy", 1),)
    assert plan.cell_fingerprint("b", "bbq", cell, 0, "bf16") != plan.cell_fingerprint("b", "bbq", cell, 0, "main")
    # logprob cells are their own group in both variants, and equal for the bf16 model
    lp = "T1-greedy-k0-logprob"
    assert plan.cell_fingerprint("b", "bbq", lp, 0, "bf16") == plan.cell_fingerprint("b", "bbq", lp, 0, "main")
    assert plan.cell_fingerprint("a", "bbq", lp, 0, "bf16") != plan.cell_fingerprint("a", "bbq", lp, 0, "main")
    jobs = plan.jobs("bf16")
    # 4 configs x 4 free-form benchmarks + CrowS-Pairs' T1/T2 zero-shot logprob configs
    assert {j.model for j in jobs} == {"a", "b"} and len(jobs) == 2 * (4 * 4 + 2)
    assert all(str(p).startswith(str(plan.layout.results / "shards_bf16") + "/") for p in plan.shards("bf16"))
    # one worker per (model, quantization): the bf16 model's variants share it
    assert plan.worker_key("b", plan.quantization("b", "bf16")) == plan.worker_key("b", plan.quantization("b"))
    assert plan.worker_key("a", "bf16") != plan.worker_key("a", "nf4")


def test_cross_package_adds_the_nominal_cells_in_bf16_and_nothing_else(tmp_path):
    # the stage compares packages at the nominal config in bf16: the run's own free-form row
    # comes from the precision check (T1-greedy-k0-freeform is in conservative_core), its
    # logprob row needs the logprob twin in bf16 too (CrowS-Pairs' is a precision-check config)
    plain = _plan(tmp_path, {"a": "nf4"})
    stage = _plan(tmp_path, {"a": "nf4"}, cross_package=True)
    benches = [b for b in stage.cfg.benchmarks if b != "crows_pairs"]
    added = {(j.benchmark, j.config.id, j.seed) for j in stage.jobs("bf16")} - \
        {(j.benchmark, j.config.id, j.seed) for j in plain.jobs("bf16")}
    assert added == {(b, "T1-greedy-k0-logprob", 0) for b in benches}
    assert stage.nominal_bf16_configs("crows_pairs") == ()
    assert {(j.benchmark, j.config.id) for j in plain.jobs("bf16")} <= \
        {(j.benchmark, j.config.id) for j in stage.jobs("bf16")}
    assert stage.jobs("main") == plain.jobs("main")
    assert all(stage.config("T1-greedy-k0-logprob") in stage.configs(b, "bf16") for b in stage.cfg.benchmarks)
    assert stage.decode_group("crows_pairs", "T1-greedy-k0-logprob", "bf16") == (("greedy", 1),)
    assert len(stage.shards("bf16")) == len(stage.jobs("bf16")) == len(plain.jobs("bf16")) + len(benches)
    # a nominal outside the precision check's envelope brings its free-form cell too; a sampled
    # nominal has no logprob twin (logprob is greedy only)
    t3 = _plan(tmp_path, {"a": "nf4"}, cross_package=True, nominal="T3-greedy-k5-freeform")
    assert t3.nominal_bf16_configs("bbq") == (t3.config("T3-greedy-k5-freeform"), t3.config("T3-greedy-k5-logprob"))
    assert t3.nominal_bf16_configs("crows_pairs") == (t3.config("T3-greedy-k5-logprob"),)
    assert len(t3.jobs("bf16")) == len(plain.jobs("bf16")) + 2 * len(benches) + 1
    sampled = _plan(tmp_path, {"a": "nf4"}, cross_package=True, nominal="T3-t0.3-k0-freeform")
    assert sampled.nominal_bf16_configs("bbq") == (sampled.config("T3-t0.3-k0-freeform"),)
    assert sorted({j.seed for j in sampled.jobs("bf16") if j.config.id == "T3-t0.3-k0-freeform"}) == [0, 1, 2, 3, 4]
    # no precision check (every model bf16, or switched off): no bf16 variant, nothing added
    assert _plan(tmp_path, {"a": "nf4"}, precision_check=False, cross_package=True).nominal_bf16_configs("bbq") == ()
    bad = _plan(tmp_path, {"a": "nf4"}, cross_package=True, nominal="T9-greedy-k0-freeform")
    with pytest.raises(ValueError, match="analysis.nominal_config"):
        bad.jobs("bf16")


@pytest.mark.parametrize("config", ["config/paper.yaml", "config/config.yaml"])
def test_the_precision_check_covers_the_papers_18_benchmark_config_pairs(config):
    # the paper's BF16 vs NF4 check: conservative_core (T1/T2 x k0/k3, greedy, free-form) on
    # the four free-form benchmarks and CrowS-Pairs' zero-shot logprob configs: 18 pairs,
    # 3 models x 18 = 54 cells; the cross-package stage adds only the logprob twins
    plan = Plan(load_config(ROOT / config))
    core = {f"{t}-greedy-{k}-freeform" for t in ("T1", "T2") for k in ("k0", "k3")}
    want = {(b, c) for b in ("truthfulqa", "bbq", "toxigen", "xstest") for c in core}
    want |= {("crows_pairs", "T1-greedy-k0-logprob"), ("crows_pairs", "T2-greedy-k0-logprob")}
    got = {(b, c.id) for b in plan.cfg.benchmarks for c in plan.precision_configs(b)}
    assert got == want and len(got) == 18
    cells = {(j.model, j.benchmark, j.config.id) for j in plan.jobs("bf16")}
    assert {(m, b, c) for m in plan.cfg.models for b, c in want} <= cells and len(plan.cfg.models) == 3
    assert {(b, c) for _, b, c in cells} - want == {
        (b, "T1-greedy-k0-logprob") for b in ("truthfulqa", "bbq", "toxigen", "xstest")}
    assert len(plan.jobs("bf16")) == 3 * (18 + 4)  # greedy only: one seed per cell


def test_precision_check_is_off_when_every_model_is_bf16(tmp_path):
    assert not _plan(tmp_path, {"b": "bf16"}).precision_check
    assert not _plan(tmp_path, {"a": "nf4"}, precision_check=False).precision_check


def test_shard_paths_and_the_variant_of_a_shard_folder(tmp_path):
    plan = _plan(tmp_path, {"a": "nf4"})
    for variant, root in SHARD_ROOTS.items():
        p = plan.layout.shard_path("a", "bbq", "T1-greedy-k0-freeform", 3, variant)
        assert p == plan.layout.results / root / "a" / "bbq" / "T1-greedy-k0-freeform" / "s3.parquet"
        assert variant_of_shard_root(p.parts[-5]) == variant
    with pytest.raises(ValueError, match="no shard folder"):
        variant_of_shard_root("shards_fp8")


def test_priorities_keep_each_models_cells_together(tmp_path):
    plan = _plan(tmp_path, {"a": "nf4", "b": "nf4", "c": "bf16"})
    order = sorted(((m, v) for m in "abc" for v in SHARD_ROOTS),
                   key=lambda mv: plan.cell_priority(*mv), reverse=True)
    assert order == [(m, v) for m in "abc" for v in ("main", "bf16")]
    assert len({plan.cell_priority(m, v) for m in "abc" for v in SHARD_ROOTS}) == 6


def test_the_decode_group_is_in_the_fingerprint(tmp_path):
    five, three = _plan(tmp_path, {"a": "nf4"}), _plan(tmp_path, {"a": "nf4"}, seeds=3)
    greedy, logprob = "T2-greedy-k0-freeform", "T2-greedy-k0-logprob"
    assert three.decode_group("bbq", greedy) == (("greedy", 1), ("t0.3", 3), ("t0.7", 3))
    assert three.cell_fingerprint("a", "bbq", greedy, 0) != five.cell_fingerprint("a", "bbq", greedy, 0)
    assert three.cell_fingerprint("a", "bbq", logprob, 0) == five.cell_fingerprint("a", "bbq", logprob, 0)
    # crows_pairs is logprob-only: no free-form group exists there
    assert five.decode_group("crows_pairs", "T1-greedy-k0-logprob") == (("greedy", 1),)


def test_cell_code_group_covers_what_changes_outputs_only():
    """A cell reruns when the code that computes its outputs changes; not for a shard
    reader's message, model preparation, the CLI or the engine benchmark."""
    from safetyrepro.provenance import CODE_GROUPS, source_files
    from safetyrepro.shards import layout_hash

    spec = CODE_GROUPS["cell"]
    files = set(source_files(*spec["paths"], exclude=spec["exclude"]))
    assert {"cells.py", "requests.py", "inference/generate.py", "models/load.py", "models/chat.py"} <= files
    assert not files & {"shards.py", "models/prepare.py", "models/sources/hub.py", "models/cli.py", "inference/bench.py",
                         "aggregate.py", "weights.py"}
    assert not any(f.startswith(("parsing/", "tasks/", "analysis/", "metrics/")) for f in files)
    # the shard layout enters through its value, not the module's text
    assert len(layout_hash()) == 64


def test_config_ids_are_looked_up_in_the_plans_table(tmp_path):
    """One place turns a config id (a wildcard, a shard folder) into a Config: the plan's
    table of the rules' configs; the jobs' Configs are the ones it returns, and an id that
    is no combination of the rules' levels is an error naming it and the rules file."""
    plan = _plan(tmp_path, {"a": "nf4"})
    for v in SHARD_ROOTS:
        assert all(plan.config(j.config.id) == j.config for j in plan.jobs(v))
    assert plan.config("T2-t0.3-k5-freeform").levels() == {
        "template": "T2", "decoding": "t0.3", "shots": "k5", "scoring": "freeform"}
    for bad in ("T1-greedy-k0", "T9-greedy-k0-freeform", "T1-greedy-k0-freeform-x"):
        with pytest.raises(ValueError, match="template-decoding-shots-scoring") as err:
            plan.config(bad)
        assert repr(bad) in str(err.value) and "envelope.yaml" in str(err.value)
        with pytest.raises(ValueError):
            plan.cell_fingerprint("a", "bbq", bad, 0)


def _tensor_folder(folder, value: float):
    """A local model folder whose weights are one real safetensors file."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.full((8,), value)}, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("setting", ["batch_size", "grouped_attention"])
def test_batch_size_and_attention_are_in_every_cell_fingerprint(tmp_path, setting):
    plan = _plan(tmp_path, {"a": "nf4", "b": "bf16"})
    cfg = yaml.safe_load(open(plan.cfg.path))
    if setting == "batch_size":
        cfg["generation"]["batch_size"] = plan.cfg.data["generation"]["batch_size"] // 2
    else:
        cfg.setdefault("runtime", {})["grouped_attention"] = not plan.cfg.section("runtime")["grouped_attention"]
    other_path = tmp_path / "half.yaml"
    other_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    other = Plan(load_config(other_path))
    for v in SHARD_ROOTS:
        for j in plan.jobs(v)[::7]:  # free-form and logprob cells of both models
            args = (j.model, j.benchmark, j.config.id, j.seed, v)
            assert plan.cell_fingerprint(*args) != other.cell_fingerprint(*args), j
    # preparation and the workers do not depend on it
    assert all(plan.fingerprints.source_fingerprint(m) == other.fingerprints.source_fingerprint(m) for m in "ab")


def test_a_local_folders_weights_are_in_its_fingerprints_and_nothing_else(tmp_path):
    """A local model's weights identity is its folder's content hash (read when a weights file
    changed, as the prepare step records it): altered weights change that model's cell,
    prepare and worker fingerprints and no other model's; a touched file with the same bytes
    changes nothing; an unreadable folder plans (its prepare job reports it)."""
    import os

    from safetyrepro.weights import weights_hash

    folder = _tensor_folder(tmp_path / "local-model", 0.0)
    plan = _plan(tmp_path, {"a": "nf4", "b": "nf4"})
    cfg = yaml.safe_load(open(plan.cfg.path))
    cfg["models"]["b"]["source"] = {"kind": "local", "path": str(folder)}
    cfg["runtime"]["resources_dir"] = str(tmp_path / "resources")  # where the weights record goes
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))

    def snapshot():
        p = Plan(load_config(path))
        cells = {(j.model, j.config.id, j.seed): p.cell_fingerprint(j.model, j.benchmark, j.config.id, j.seed)
                 for j in p.jobs() if j.benchmark == "bbq"}
        return p, cells, {m: (p.fingerprints.source_fingerprint(m), p.worker_key(m, "nf4")) for m in "ab"}

    p0, cells0, prep0 = snapshot()
    assert p0.fingerprints.weights_identity("a") is None and p0.fingerprints.weights_identity("b") == weights_hash(folder)
    _tensor_folder(folder, 1.0)                      # same size, one tensor altered
    p1, cells1, prep1 = snapshot()
    assert p1.fingerprints.weights_identity("b") == weights_hash(folder) != p0.fingerprints.weights_identity("b")
    assert prep1["a"] == prep0["a"] and prep1["b"][0] != prep0["b"][0] and prep1["b"][1] != prep0["b"][1]
    changed = {k for k in cells0 if cells0[k] != cells1[k]}
    assert changed == {k for k in cells0 if k[0] == "b"} and changed
    st = (folder / "model.safetensors").stat()
    os.utime(folder / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched only
    assert snapshot()[1:] == (cells1, prep1)
    # a worker fingerprints with the weights it loaded, not the folder's now
    cid = "T1-greedy-k0-freeform"
    c = p1.config(cid)
    loaded = loaded_weights_identity(p1.cfg, "b", {"model_key": "b", "weights_hash": p0.fingerprints.weights_identity("b")})
    fields = cell_fingerprint_fields(p1.cfg, "b", p1.quantization("b"), "bbq", c, 0, p1.decode_group("bbq", cid),
                                     template_hash=p1.fingerprints.template_hash("bbq", c.template), weights=loaded,
                                     code=p1.fingerprints.inference_code, compute=p1.runtime.compute_dtype(p1.quantization("b")),
                                     linear=p1.runtime.linear(p1.quantization("b")))
    assert cell_fingerprint(fields, p1.fingerprints.chat_template_hash("b")) == cells0[("b", cid, 0)]
    assert cell_fingerprint(fields, p1.fingerprints.chat_template_hash("b")) != cells1[("b", cid, 0)]
    (folder / "model.safetensors").unlink()
    assert snapshot()[0].fingerprints.weights_identity("b") == f"unreadable:{folder}"


def test_decode_groups_of_the_default_envelope_are_one_job_each(tmp_path):
    import itertools

    plan = _plan(tmp_path, {"a": "nf4", "b": "nf4"})
    g = plan.group_jobs("main")
    assert g.members == (("greedy", 0), *(("t0.3", s) for s in range(5)), *(("t0.7", s) for s in range(5)))
    assert g.models == ("a", "b") and "crows_pairs" not in g.benchmarks
    assert g.templates == ("T1", "T2", "T3", "T4") and g.shots == ("k0", "k3", "k5")
    # the groups' cells are exactly the variant's free-form cells, each in one group
    covered = [(m, b, cid, s) for m, b, t, k in itertools.product(g.models, g.benchmarks, g.templates, g.shots)
               for cid, s, _ in plan.group_cells("main", m, b, t, k)]
    freeform = [(j.model, j.benchmark, j.config.id, j.seed) for j in plan.jobs("main") if j.config.scoring == "freeform"]
    assert sorted(covered) == sorted(freeform) and len(covered) == len(set(covered))
    cid, seed, fp = plan.group_cells("main", "b", "bbq", "T4", "k5")[7]
    assert (cid, seed) == ("T4-t0.7-k5-freeform", 1)
    assert fp == plan.cell_fingerprint("b", "bbq", cid, seed, chat_template=False)
    # the output patterns name the same shards
    pattern = g.output_patterns(plan.layout)[7]
    assert pattern.format(shards="shards", model="b", benchmark="bbq", template="T4", shots="k5") == \
        str(plan.layout.shard_path("b", "bbq", cid, seed))
    with pytest.raises(ValueError, match="no group job"):
        plan.group_cells("main", "b", "crows_pairs", "T1", "k0")
    # the precision check's cells are greedy only: no group of more than one cell
    assert plan.group_jobs("bf16") is None


def _plan_with_rule(tmp_path, rule: dict) -> Plan:
    rules = yaml.safe_load((ROOT / "config/envelope.yaml").read_text())
    rules["validity"].append(rule)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "envelope.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    cfg = config_copy(ROOT / "config/config.yaml")
    cfg["envelope"]["rules"] = str(path)
    cfg["runtime"]["results_dir"] = str(tmp_path / "results")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return Plan(load_config(tmp_path / "c.yaml"))


def test_irregular_decode_groups_stay_one_job_per_cell(tmp_path):
    # chain of thought greedy only: its free-form cells are groups of one; the rest stay groups
    plan = _plan_with_rule(tmp_path / "a", {"id": "t4-greedy", "when": {"template": ["T4"]},
                                            "require": {"decoding": ["greedy"]}})
    g = plan.group_jobs("main")
    assert g.templates == ("T1", "T2", "T3") and len(g.members) == 11
    # chain of thought without T=0.7: two shapes of group, so no group jobs at all
    plan = _plan_with_rule(tmp_path / "b", {"id": "t4-no-t07", "when": {"template": ["T4"]},
                                            "require": {"decoding": ["greedy", "t0.3"]}})
    assert plan.group_jobs("main") is None
