"""Real cells with the smallest embedded model (SmolLM2, fp32 so reruns are exact) on a few
items of every benchmark: both scoring paths and a sampled decoding; shard schema, metadata,
determinism and the error paths of `run_cell`."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import yaml

from safetyrepro.cells import ModelCellRunner, run_cell
from safetyrepro.config import load_config
from safetyrepro.errors import CellError
from safetyrepro.items import build_items
from safetyrepro.tasks import load_task
from safetyrepro.models import load_model
from safetyrepro.shards import SHARD_SCHEMA, read_shard
from numerics import Trace, assert_sequences_agree, model_rel_tol
from workflow_support import DATA, ROOT
from config_support import config_copy

pytestmark = pytest.mark.slow

TIMING = {"latency_s"}  # the only row fields that may differ between identical reruns


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("cells")
    cfg = config_copy(ROOT / "config/config.yaml")
    cfg["benchmarks"] = {b: {"n_items": 2} for b in ("truthfulqa", "bbq", "toxigen", "crows_pairs", "xstest")}
    cfg["models"] = {"smol": dict(cfg["models"]["smollm2-135m"], quantization="fp32")}
    cfg["data"]["local_dir"] = str(DATA)
    cfg["runtime"].update(results_dir=str(d / "results"), resources_dir=str(ROOT / "resources"), device="cpu")
    cfg["generation"]["max_new_tokens"] = {"T1": 6, "T2": 6, "T3": 6, "T4": 12}
    path = d / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    rc = load_config(path)
    for b in rc.benchmarks:
        build_items(rc, b)
    lm = load_model(rc, "smol")
    return d, str(path), ModelCellRunner(lm)


def _request(path, model, benchmark, cell, seed, out, variant="main"):
    """The plan's resolved request of a cell; for a cell the plan cannot resolve (an invalid
    id, a seed out of range) a valid request with that id and seed put in, as a client may."""
    from safetyrepro.plan import Plan

    plan = Plan(load_config(path))
    try:
        return plan.cell_request(model, benchmark, cell, seed, out, variant)
    except ValueError:
        base = plan.cell_request(model, benchmark, "T1-greedy-k0-logprob", 0, out, variant)
        return base.replace(config_id=cell, seed=seed, fingerprint=None)


def _run(setup, benchmark, cell, seed=0, name=None):
    d, path, worker = setup
    out = d / "shards" / (name or f"{benchmark}-{cell}-s{seed}.parquet")
    summary = run_cell(_request(path, "smol", benchmark, cell, seed, out), worker, progress=False)
    return out, summary


def _count_streams(monkeypatch) -> list[int]:
    """The number of streams of every generate_streams call from now on (the engine function
    the cells' :class:`~safetyrepro.inference.backend.EngineBackend` calls)."""
    import safetyrepro.inference.backend as backend

    calls, orig = [], backend.generate_streams

    def counting(*a, **kw):
        calls.append(len(a[2]))
        return orig(*a, **kw)
    monkeypatch.setattr(backend, "generate_streams", counting)
    return calls


def _content(path):
    table, meta = read_shard(path)
    rows = [{k: v for k, v in r.items() if k not in TIMING} for r in table.to_pylist()]
    meta = {k: v for k, v in meta.as_dict().items() if k not in {"wall_s"}}
    return rows, meta


@pytest.mark.parametrize("benchmark, cell", [
    ("truthfulqa", "T1-greedy-k3-freeform"), ("truthfulqa", "T2-greedy-k0-logprob"),
    ("bbq", "T3-greedy-k0-freeform"), ("bbq", "T1-greedy-k5-logprob"),
    ("toxigen", "T4-greedy-k3-freeform"), ("toxigen", "T2-greedy-k3-logprob"),
    ("crows_pairs", "T1-greedy-k0-logprob"), ("crows_pairs", "T4-greedy-k5-logprob"),
    ("xstest", "T2-greedy-k0-freeform"), ("xstest", "T3-greedy-k3-logprob"),
])
def test_cell_shard_schema_and_metadata(setup, benchmark, cell):
    out, summary = _run(setup, benchmark, cell)
    table, shard_meta = read_shard(out)
    meta = shard_meta.as_dict()
    assert table.schema.equals(SHARD_SCHEMA, check_metadata=False)
    assert table.num_rows == 2 and summary["n_items"] == 2
    for key in ("rules_stamp", "config_hash", "subset_hash", "fewshot_ids", "template_hash", "model_info",
                "quantization", "device", "code_version", "cell", "seed", "fingerprint", "variant",
                "decode_group", "parser_version"):
        assert meta[key] not in (None, ""), key
    assert meta["quantization"] == "fp32" and meta["device"] == "cpu"
    assert meta["model_info"]["weights_hash"] and meta["model_info"]["torch_version"]
    assert meta["model_info"]["transformers_version"] and "bitsandbytes_version" in meta["model_info"]
    assert len(meta["fewshot_ids"]) == int(cell.split("-")[2][1:])
    assert meta["variant"] == "main" and meta["parser_version"] == load_task(benchmark).parser_version
    # what the engine decided about the cell's batches: nothing ran out of memory here, and a
    # free-form cell's decode group was planned once over the cell's two prompts and records
    # what its decode forwards computed (the engine's DecodeStats, not dropped on the way)
    assert meta["batching"]["oom_splits"] == []
    gen_plans = [p for p in meta["batching"]["plans"] if p["what"] == "generation"]
    decode = meta["batching"]["decode"]
    if cell.endswith("freeform"):
        assert len(gen_plans) == 1 and sum(b["prompts"] for b in gen_plans[0]["batches"]) == 2
        # a sequence of n tokens took n - 1 decode forwards of its group (the first token comes
        # from the prefill); no forward runs past max_new_tokens
        (d,) = decode
        longest = max(r["n_gen_tokens"] for r in table.to_pylist())
        assert longest - 1 <= d["forwards"] <= meta["max_new_tokens"] - 1
        assert 0 <= d["distinct"] <= d["tokens"] and d["distinct"] <= d["token_slots"]
        assert d["forwards"] == 0 or d["distinct"] > 0
    else:
        assert gen_plans == [] and decode == []
    rows = table.to_pylist()
    if cell.endswith("logprob"):
        for r in rows:
            assert r["raw_output"] is None and r["parse_ok"]
            assert len(r["cand_logliks"]) == len(r["cand_ntokens"]) >= 2
            assert r["chosen_index"] == max(range(len(r["cand_logliks"])), key=r["cand_logliks"].__getitem__)
    else:
        for r in rows:
            assert isinstance(r["raw_output"], str) and r["n_gen_tokens"] >= 1
            assert r["parse_ok"] == (r["parsed_label"] is not None)


def test_greedy_rerun_identical(setup):
    a, _ = _run(setup, "bbq", "T1-greedy-k3-freeform", name="a.parquet")
    b, _ = _run(setup, "bbq", "T1-greedy-k3-freeform", name="b.parquet")
    assert _content(a) == _content(b)


def test_sampled_seeds_reproducible_and_distinct(setup):
    cell = "T4-t0.7-k0-freeform"
    s0, _ = _run(setup, "xstest", cell, seed=0, name="s0.parquet")
    s1, _ = _run(setup, "xstest", cell, seed=1, name="s1.parquet")      # served from the seed cache
    s0b, _ = _run(setup, "xstest", cell, seed=0, name="s0b.parquet")    # regenerated afresh
    out0 = [r["raw_output"] for r in read_shard(s0)[0].to_pylist()]
    assert out0 == [r["raw_output"] for r in read_shard(s0b)[0].to_pylist()]
    assert out0 != [r["raw_output"] for r in read_shard(s1)[0].to_pylist()]


@pytest.mark.numerics
def test_a_decode_group_is_generated_once_and_handed_out_per_job(setup, monkeypatch):
    """The greedy, T=0.3 and T=0.7 cells of one (template, shots) form one decode group: the
    first of their jobs generates all 11 sequences per item in one batch, the others are
    served from memory in any order, a rerun regenerates the same outputs, and the group is in
    every member's fingerprint."""
    from safetyrepro.inference import generate as plain_generate
    from safetyrepro.plan import Plan

    d, path, worker = setup
    lm = worker.lm
    plan = Plan(load_config(path))
    group = plan.decode_group("bbq", "T2-t0.3-k0-freeform")
    assert group == (("greedy", 1), ("t0.3", 5), ("t0.7", 5))
    assert plan.decode_group("bbq", "T2-greedy-k0-freeform") == group
    assert plan.decode_group("bbq", "T2-greedy-k0-logprob") == (("greedy", 1),)
    calls = _count_streams(monkeypatch)
    order = [("t0.7", 3), ("greedy", 0), ("t0.3", 0), ("t0.7", 0), ("t0.3", 4)]
    outs = {}
    with Trace().recording() as group_trace:
        for dec, seed in order:
            out, _ = _run(setup, "bbq", f"T2-{dec}-k0-freeform", seed=seed, name=f"g-{dec}-{seed}.parquet")
            outs[dec, seed] = [r["raw_output"] for r in read_shard(out)[0].to_pylist()]
    assert calls == [11]
    # fp32: each member equals its decoding computed on its own, up to the rounding rule of
    # tests/numerics.py (the group is another batch shape)
    prompts = read_shard(out)[0].column("prompt").to_pylist()
    kw = dict(max_new_tokens=6, batch_size=16)
    with Trace().recording() as alone_trace:
        alone = {("greedy", 0): plain_generate(lm, prompts, temperature=0, **kw),
                 ("t0.7", 3): plain_generate(lm, prompts, temperature=0.7, seed=3, **kw)}
    parted = assert_sequences_agree(group_trace, alone_trace, model_rel_tol(lm))
    for (dec, seed), gens in alone.items():
        t = 0.0 if dec == "greedy" else float(dec[1:])
        for p, mine, g in zip(prompts, outs[dec, seed], gens):
            if alone_trace.get(t, p, seed)[0].key not in parted:
                assert mine == g.text
    # asking again for a member already handed out regenerates the group, same outputs
    again, _ = _run(setup, "bbq", "T2-t0.7-k0-freeform", seed=3, name="g-again.parquet")
    assert [r["raw_output"] for r in read_shard(again)[0].to_pylist()] == outs["t0.7", 3]
    assert calls == [11, 11]
    # the group is part of each member's fingerprint: three seeds instead of five change
    # the greedy cell's batch, so its fingerprint
    three = yaml.safe_load(open(path))
    three["envelope"]["seeds"] = 3
    (d / "three.yaml").write_text(yaml.safe_dump(three))
    other = Plan(load_config(d / "three.yaml"))
    assert other.decode_group("bbq", "T2-greedy-k0-freeform") == (("greedy", 1), ("t0.3", 3), ("t0.7", 3))
    assert other.cell_fingerprint("smol", "bbq", "T2-greedy-k0-freeform", 0) != \
        plan.cell_fingerprint("smol", "bbq", "T2-greedy-k0-freeform", 0)
    assert other.cell_fingerprint("smol", "bbq", "T2-greedy-k0-logprob", 0) == \
        plan.cell_fingerprint("smol", "bbq", "T2-greedy-k0-logprob", 0)


@pytest.mark.parametrize("benchmark, cell, seed, needle", [
    ("crows_pairs", "T1-greedy-k0-freeform", 0, "crows-logprob-only"),
    ("bbq", "T1-t0.3-k0-logprob", 0, "logprob-greedy-only"),
    ("bbq", "T1-t0.3-k0-freeform", 7, "seed 7 out of range"),
    ("bbq", "T1-greedy-k0", 0, "template-decoding-shots-scoring"),
])
def test_invalid_cells_are_refused_naming_the_cell(setup, benchmark, cell, seed, needle):
    d, path, worker = setup
    request = _request(path, "smol", benchmark, cell, seed, d / "invalid.parquet")
    with pytest.raises(CellError) as err:
        run_cell(request, worker, progress=False)
    assert needle in str(err.value) and "smol/" in str(err.value)
    assert not (d / "invalid.parquet").exists()


def test_a_request_naming_another_rules_file_is_refused(setup, tmp_path):
    """The rules file a job declares is the one its run config reads, else the cell is refused."""
    d, path, worker = setup
    request = _request(path, "smol", "bbq", "T1-greedy-k0-logprob", 0, tmp_path / "x.parquet")
    other = tmp_path / "envelope.yaml"
    other.write_text(open(request.rules).read())
    with pytest.raises(CellError, match="declares the rules file"):
        run_cell(request.replace(rules=str(other)), worker, progress=False)
    assert not (tmp_path / "x.parquet").exists()


def test_missing_items_named(setup, tmp_path):
    d, path, worker = setup
    cfg = yaml.safe_load(open(path))
    cfg["runtime"]["results_dir"] = str(tmp_path / "empty")
    p2 = tmp_path / "c.yaml"
    p2.write_text(yaml.safe_dump(cfg))
    request = _request(p2, "smol", "bbq", "T1-greedy-k0-freeform", 0, tmp_path / "x.parquet")
    with pytest.raises(CellError, match="item file .*bbq.parquet is missing"):
        run_cell(request, worker, progress=False)
    assert not (tmp_path / "x.parquet").exists()


def test_prefill_store_budget_is_a_runtime_setting(setup, tmp_path):
    d, path, worker = setup
    cfg = load_config(path)
    assert worker.prefills(cfg).max_bytes == 2048 << 20      # the default
    raw = yaml.safe_load(open(path))
    raw["runtime"]["prefill_store_mb"] = 0
    (tmp_path / "off.yaml").write_text(yaml.safe_dump(raw))
    off = worker.prefills(load_config(tmp_path / "off.yaml"))
    assert off.max_bytes == 0
    off.put("k", object(), 1)
    assert len(off) == 0                                           # 0 keeps nothing
    raw["runtime"]["prefill_store_mb"] = -1
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(Exception, match="prefill_store_mb"):
        load_config(tmp_path / "bad.yaml")
    worker.prefills(cfg)                                            # back to the default


def test_a_bf16_model_runs_its_precision_check_cells_as_the_bf16_variant(setup, tmp_path, monkeypatch):
    """A model configured as bf16, with the precision check on: its bf16 cell (conservative_core,
    greedy alone) decodes one stream and carries the bf16 variant's fingerprint, not the main
    cell's decode group of 11 streams and fingerprint. The variant is an argument of the
    cell, never guessed from the quantization."""
    from safetyrepro.plan import Plan

    d, path, _ = setup
    raw = yaml.safe_load(open(path))
    raw["models"]["smol16"] = dict(raw["models"]["smol"], quantization="bf16")
    raw["analysis"]["precision_check"] = True
    p16 = tmp_path / "bf16.yaml"
    p16.write_text(yaml.safe_dump(raw))
    rc = load_config(p16)
    plan = Plan(rc)
    assert plan.precision_check and plan.quantization("smol16", "bf16") == plan.quantization("smol16") == "bf16"
    cell = "T1-greedy-k0-freeform"
    assert plan.decode_group("bbq", cell, "main") == (("greedy", 1), ("t0.3", 5), ("t0.7", 5))
    assert plan.decode_group("bbq", cell, "bf16") == (("greedy", 1),)
    calls = _count_streams(monkeypatch)
    worker16 = ModelCellRunner(load_model(rc, "smol16"))
    metas = {}
    for variant in ("bf16", "main"):
        out = tmp_path / f"{variant}.parquet"
        run_cell(_request(p16, "smol16", "bbq", cell, 0, out, variant), worker16, progress=False)
        metas[variant] = read_shard(out)[1].as_dict()
    assert calls == [1, 11]
    for variant, meta in metas.items():
        assert meta["variant"] == variant and meta["quantization"] == "bf16"
        assert meta["decode_group"] == [list(g) for g in plan.decode_group("bbq", cell, variant)]
        assert meta["fingerprint"] == plan.cell_fingerprint("smol16", "bbq", cell, 0, variant)
    assert metas["bf16"]["fingerprint"] != metas["main"]["fingerprint"]
    nf4 = _request(p16, "smol16", "bbq", cell, 0, tmp_path / "x.parquet", "bf16").replace(quantization="nf4")
    with pytest.raises(CellError, match="quantization 'nf4' given"):
        run_cell(nf4, worker16, progress=False)


def test_chat_template_hash_in_shard_and_fingerprint(setup):
    """Every shard records the model's chat-template hash; the fingerprint it records includes
    the hash from the prepared-model marker (what aggregation expects), and a model whose
    template differs from the prepared one is refused."""
    from safetyrepro.models.chat import template_hash
    from safetyrepro.plan import Plan

    d, path, worker = setup
    plan = Plan(load_config(path))
    marker = plan.layout.model_marker("smol")
    marker.parent.mkdir(parents=True, exist_ok=True)
    cell = "T2-greedy-k0-logprob"
    try:
        marker.write_text(json.dumps({"smol": {"chat_template_hash": template_hash(worker.lm.tokenizer)}}))
        out, _ = _run(setup, "truthfulqa", cell, name="chat-template.parquet")
        meta = read_shard(out)[1].as_dict()
        lm = worker.lm
        assert meta["chat_template_hash"] == lm.info["chat_template_hash"] == template_hash(lm.tokenizer)
        plan = Plan(load_config(path))
        with_tpl = plan.cell_fingerprint("smol", "truthfulqa", cell, 0)
        assert meta["fingerprint"] == with_tpl
        assert with_tpl != plan.cell_fingerprint("smol", "truthfulqa", cell, 0, chat_template=False)
        marker.write_text(json.dumps({"smol": {"chat_template_hash": "0" * 64}}))
        assert Plan(load_config(path)).cell_fingerprint("smol", "truthfulqa", cell, 0) != with_tpl
        with pytest.raises(CellError, match="chat template .* is not the one its prepare step recorded"):
            _run(setup, "truthfulqa", cell, name="chat-template-2.parquet")
    finally:
        marker.unlink(missing_ok=True)
def test_nan_logits_in_free_form_decoding_fail_the_cell_naming_the_item(setup, tmp_path):
    """A model whose final norm is corrupted yields NaN logits: the free-form cell fails naming
    its first item, instead of scoring token 0 as parse failures, and writes no shard."""
    import copy
    import dataclasses

    import torch

    from safetyrepro.items import read_items

    d, path, worker = setup
    broken = ModelCellRunner(dataclasses.replace(worker.lm, model=copy.deepcopy(worker.lm.model)))
    with torch.no_grad():
        broken.lm.model.model.norm.weight.fill_(float("nan"))
    ids = set(read_items(load_config(path).results_dir / "items" / "truthfulqa.parquet")[0]["item_id"])
    out = tmp_path / "nan.parquet"
    with pytest.raises(CellError, match=r"item (\S+): non-finite logit \(nan\)") as ei:
        run_cell(_request(path, "smol", "truthfulqa", "T3-greedy-k5-freeform", 0, out), broken,
                 progress=False)
    import re

    assert re.search(r"item (\S+): non-finite", str(ei.value)).group(1) in ids   # a real item id
    assert not out.exists()
