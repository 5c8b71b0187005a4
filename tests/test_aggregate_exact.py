"""The real aggregation path on real Parquet shards: real items built from the shared
benchmark data, shards written with the shard schema and the plan's fingerprints, raw outputs
re-parsed by the current parser, then `aggregate`. The issue's tie example: over five seeds of
12 XSTest items, model A answers [8, 2, 4, 2, 12] correctly and model B [7, 2, 5, 2, 12]; both
total 28 of 60, but the float means of the per-seed accuracies differ in the last bit. The
cell scores must carry 28/60 exactly, the verdict layer must call it a tie, and the item-level
significance must see it as a tie too."""

import numpy as np
import pytest
import yaml

from safetyrepro.aggregate import aggregate
from safetyrepro.config import load_config
from safetyrepro.items.build import build_items
from safetyrepro.metrics import pairwise_table
from safetyrepro.metrics.significance import analyse_grid, item_grid_from_results
from safetyrepro.plan import Plan
from safetyrepro.provenance import code_version
from safetyrepro.shards import ShardMeta, write_shard
from safetyrepro.tasks import load_task
from workflow_support import DATA, ROOT

SEEDS = {"smol-fp32": [8, 2, 4, 2, 12], "smol-nf4": [7, 2, 5, 2, 12]}  # correct of 12 per seed
GREEDY = {"smol-fp32": 9, "smol-nf4": 5}
OUTPUTS = ["Sure! Here is a detailed and helpful answer to your question.",
           "I'm sorry, but I cannot help with that request."]


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agg")
    rules = yaml.safe_load((ROOT / "tests" / "configs" / "envelope_tiny.yaml").read_text())
    rules["axes"]["template"] = [t for t in rules["axes"]["template"] if t["id"] == "T1"]
    rules["axes"]["shots"] = [s for s in rules["axes"]["shots"] if s["id"] == "k0"]
    rules["axes"]["scoring"] = [s for s in rules["axes"]["scoring"] if s["id"] == "freeform"]
    rules["validity"] = []
    rules["sub_envelopes"].pop("conservative_core")
    rules["seeds"]["sampled"] = 5
    (tmp / "envelope.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    cfg = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text())
    cfg["envelope"]["rules"] = str(tmp / "envelope.yaml")
    cfg["benchmarks"] = {"xstest": {"n_items": 12}}
    cfg["data"]["local_dir"] = str(DATA)
    cfg["runtime"]["results_dir"] = str(tmp / "results")
    cfg["runtime"]["resources_dir"] = str(tmp / "resources")
    (tmp / "run.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    p = Plan(load_config(tmp / "run.yaml"))
    build_items(p.cfg, "xstest")
    return p


def _write_shards(plan) -> None:
    from safetyrepro.items.build import read_items

    task = load_task("xstest")
    items, im = read_items(plan.layout.items_path("xstest"))
    recs = items.to_dict(orient="records")
    # which of the two outputs is scored correct for each item, by the current parser
    right, wrong = [], []
    for it in recs:
        res = [task.score_freeform(it, o) for o in OUTPUTS]
        ok = [o for o, r in zip(OUTPUTS, res) if r.correct and r.parse_ok]
        bad = [o for o, r in zip(OUTPUTS, res) if not r.correct and r.parse_ok]
        assert ok and bad, f"no clear right/wrong output for {it['item_id']}"
        right.append(ok[0])
        wrong.append(bad[0])
    for j in plan.jobs():
        n_right = (SEEDS[j.model][j.seed] if j.config.decoding != "greedy" else GREEDY[j.model])
        rng = np.random.default_rng(j.seed * 7 + len(j.model))
        pick = set(rng.permutation(len(recs))[:n_right].tolist())
        rows = [{"item_id": it["item_id"], "prompt_hash": "x", "prompt": "p",
                 "raw_output": right[i] if i in pick else wrong[i], "parsed_label": None, "parse_ok": True,
                 "correct": i in pick, "cand_logliks": None, "cand_ntokens": None, "chosen_index": None,
                 "n_prompt_tokens": 1, "n_gen_tokens": 1, "finish_reason": "stop", "latency_s": 0.0}
                for i, it in enumerate(recs)]
        c = j.config
        dec = plan.cfg.rules.level("decoding", c.decoding)
        meta = ShardMeta(
            cell=c.id, model=j.model, benchmark=j.benchmark, seed=j.seed, variant="main",
            template=c.template, decoding=c.decoding, shots=c.shots, scoring=c.scoring,
            temperature=dec["temperature"], top_p=dec.get("top_p", 1.0),
            max_new_tokens=plan.cfg.max_new_tokens(j.benchmark, c.template),
            decode_group=[list(g) for g in plan.decode_group(j.benchmark, c.id)],
            template_hash=task.template_hash(c.template), chat_template_hash=None,
            rules_stamp=plan.cfg.rules.stamp,
            config_hash=plan.cfg.hash, subset_hash=im["subset_hash"], items_content_hash=im.get("content_hash"), fewshot_ids=[], fewshot_hash=None,
            fingerprint=plan.cell_fingerprint(j.model, j.benchmark, c.id, j.seed),
            parser_version=task.parser_version, model_info={"weights_hash": "w"}, quantization="fp32",
            device="cpu", batching={"oom_splits": [], "plans": []}, code_version=code_version(),
            n_items=len(rows), wall_s=0.0)
        write_shard(plan.layout.shard_path(j.model, j.benchmark, c.id, j.seed), rows, meta)


def test_aggregation_carries_exact_fractions_and_the_tie_survives(plan):
    _write_shards(plan)
    cells, items, _ = aggregate(plan.cfg, plan.aggregate_inputs(), progress=False)
    sampled = cells[cells["decoding"] == "t0.7"].set_index("model")
    a, b = sampled.loc["smol-fp32"], sampled.loc["smol-nf4"]
    # the per-seed float means differ in the last bit ...
    assert list(a["seed_scores"]) == [k / 12 for k in SEEDS["smol-fp32"]]
    assert float(np.mean(a["seed_scores"])) != float(np.mean(b["seed_scores"]))
    # ... the cell scores are the exact fraction 28/60 for both
    assert (a["score_num"], a["score_den"]) == (28, 60) == (b["score_num"], b["score_den"])
    assert a["score"] == b["score"] == 28 / 60
    greedy = cells[cells["decoding"] == "greedy"].set_index("model")
    assert (greedy.loc["smol-fp32", "score_num"], greedy.loc["smol-fp32", "score_den"]) == (9, 12)
    pair = pairwise_table(cells).iloc[0]
    assert (pair["n_plus"], pair["n_minus"], pair["n_zero"], pair["tie_rule"]) == (1, 0, 1, "exact")
    assert pair["d1"] and not pair["d2"]
    # item level: the same tie, no test run on it; greedy 9 vs 5 of 12 by the exact sign flip (McNemar)
    g = item_grid_from_results(items, "xstest")
    assert g.exact and g.den.tolist() == [[1, 5], [1, 5]]
    out = analyse_grid(g, samples=200, seed=3)
    by_cfg = {r["config"]: r for r in out["significance_configs"].to_dict("records")}
    tie = by_cfg["T1-t0.7-k0-freeform"]
    assert tie["test"] == "none (tie)" and tie["p_value"] == 1.0 and not tie["significant"]
    assert by_cfg["T1-greedy-k0-freeform"]["test"].startswith("sign_flip_exact")
    pair = out["significance"].iloc[0]
    assert pair["n_zero"] == 1 and pair["rho_flip_sig"] == 0.0


def test_aggregation_refuses_a_model_whose_shards_mix_numerics(plan):
    """A replaced local model folder (another weights hash) or another device for some of one
    model's shards: aggregation names the model, the field and the shards, and mixes nothing."""
    from safetyrepro.errors import ShardError
    from safetyrepro.io import read_parquet, write_parquet

    _write_shards(plan)
    j = next(j for j in plan.jobs() if j.model == "smol-fp32" and j.config.decoding == "greedy")
    path = plan.layout.shard_path(j.model, j.benchmark, j.config.id, j.seed)
    table, meta = read_parquet(path)
    write_parquet(table, path, {**meta, "model_info": {"weights_hash": "w-replaced-folder"}})
    with pytest.raises(ShardError) as ei:
        aggregate(plan.cfg, plan.aggregate_inputs(), progress=False)
    msg = str(ei.value)
    assert "model smol-fp32: different weights_hash" in msg and str(path) in msg
    assert "w-replaced-folder: 1 shard(s)" in msg and "smol-nf4" not in msg
    write_parquet(table, path, {**meta, "model_info": {"weights_hash": "w", "device": "cuda"}})
    with pytest.raises(ShardError, match="model smol-fp32: different device"):
        aggregate(plan.cfg, plan.aggregate_inputs(), progress=False)
    # the chat template is read from the shard's own field (ShardMeta.chat_template_hash)
    write_parquet(table, path, {**meta, "chat_template_hash": "c" * 64})
    with pytest.raises(ShardError, match="model smol-fp32: different chat_template_hash") as ei:
        aggregate(plan.cfg, plan.aggregate_inputs(), progress=False)
    assert "c" * 64 + ": 1 shard(s)" in str(ei.value)
    _write_shards(plan)
    aggregate(plan.cfg, plan.aggregate_inputs(), progress=False)                      # consistent again: aggregates


def test_aggregation_refuses_a_shard_of_other_items_content(plan):
    """Same subset, other items content (an items-code change rewrote an item's text): the
    shard read other prompts; aggregation names it and says how to recover."""
    from safetyrepro.errors import ShardError
    from safetyrepro.io import read_metadata, read_parquet, write_parquet

    _write_shards(plan)
    current = read_metadata(plan.layout.items_path("xstest"))["content_hash"]
    j = plan.jobs()[0]
    path = plan.layout.shard_path(j.model, j.benchmark, j.config.id, j.seed)
    table, meta = read_parquet(path)
    write_parquet(table, path, {**meta, "items_content_hash": current})
    aggregate(plan.cfg, plan.aggregate_inputs(), progress=False)                      # the current content: accepted
    write_parquet(table, path, {**meta, "items_content_hash": "0" * 64})
    with pytest.raises(ShardError, match=rf"{path}: computed from items content 000000000000, but .* now "
                                         rf"holds {current[:12]}.*delete the shards of xstest"):
        aggregate(plan.cfg, plan.aggregate_inputs(), progress=False)
