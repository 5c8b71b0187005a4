"""The cross-package stage: lm-eval's TruthfulQA MC1 score on a few of the run's items checked
against a hand computation with transformers, and the table's agreement / spread / ordering
columns on rows built by hand."""

from __future__ import annotations

import pytest

from conftest import SHARED_DATA

N_ITEMS = 3


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["stock", "shared-context"])
def test_lmeval_truthfulqa_score_by_hand(default_cfg, tmp_path, loop):
    """Both lm-eval loops (lm-eval's own, and the stage's shared-context one over the run's
    scorer) against a hand computation, in fp32 so that rounding cannot move an argmax."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from safetyrepro.crosspkg.stage import lmeval_rows
    from safetyrepro.items.build import load_benchmark
    from safetyrepro.models.load import load_model
    from safetyrepro.models.prepare import prepare_model

    df = load_benchmark("truthfulqa", SHARED_DATA)
    items = df[df["split"] == "validation"].reset_index(drop=True).iloc[:N_ITEMS].copy()
    folder = str(prepare_model(default_cfg, "smollm2-135m", progress=False))
    engine = load_model(default_cfg, "smollm2-135m", quantization="fp32") if loop == "shared-context" else None
    (row,) = lmeval_rows(folder, "smol", {"truthfulqa": items}, {}, tmp_path, dtype="float32", loop=loop,
                         engine=engine)
    assert row["package"] == "lm-eval" and row["version"] == "0.4.13" and row["n_items"] == N_ITEMS
    assert row["precision"] == "fp32" and ("each context computed once" in row["numerics"]) == (loop != "stock")
    assert row["first_prompt"].startswith("Q: What is human life expectancy")
    assert row["first_prompt"].endswith("Q: " + items.iloc[0]["question"] + "\nA:")

    # by hand: lm-eval's context, each option (leading space) as continuation, summed log-probs
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prefix = row["first_prompt"][: -len("Q: " + items.iloc[0]["question"] + "\nA:")]
    correct, chosen = 0, {}
    for it in items.to_dict("records"):
        ctx = prefix + "Q: " + it["question"] + "\nA:"
        lls = []
        for c in it["choices"]:
            whole = tok(ctx + " " + c)["input_ids"]
            n_ctx = len(tok(ctx)["input_ids"])
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([whole])).logits[0].float(), -1)
            lls.append(sum(float(logp[i - 1, whole[i]]) for i in range(n_ctx, len(whole))))
        j = max(range(len(lls)), key=lls.__getitem__)
        chosen[it["item_id"]] = j
        correct += j == int(it["gold"])
    assert row["score"] == correct / N_ITEMS
    assert row["chosen"] == chosen          # mapped back to the run's option order


@pytest.mark.slow
def test_shared_context_loop_matches_lmevals_own_loop(default_cfg):
    """SharedContextHFLM returns what lm-eval's HFLM loop returns, request by request (fp32):
    contexts sharing a long prefix, contexts of their own, the empty context (lm-eval's prefix
    token), one-token and repeated candidates, and a request longer than max_length (handed to
    lm-eval's own loop, which truncates it)."""
    from lm_eval.models.huggingface import HFLM

    from safetyrepro.crosspkg.lmeval_model import SharedContextHFLM
    from safetyrepro.models.load import load_model
    from safetyrepro.models.prepare import prepare_model

    folder = str(prepare_model(default_cfg, "smollm2-135m", progress=False))
    stock = HFLM(pretrained=folder, device="cpu", dtype="float32", batch_size=4, max_length=64)
    shared = SharedContextHFLM(load_model(default_cfg, "smollm2-135m", quantization="fp32"), tokenizer=folder,
                               batch_size=4, max_length=64)
    preamble = "Q: What is the capital of France?\nA: Paris.\n\nQ: What colour is the sky?\nA: Blue.\n\n"
    reqs = [(preamble + "Q: How many legs does a spider have?\nA:", c) for c in (" Eight.", " Six.", " Eight.")]
    reqs += [(preamble + "Q: Is water wet?\nA:", c) for c in (" Yes.", " No, water is not wet at all.")]
    reqs += [("The nurse said that", c) for c in (" she", " he", " they would be late")]
    reqs += [("", "The doctor was late."), ("", "The nurse was late.")]
    reqs += [(preamble * 3 + "Q: Why?\nA:", " Because.")]          # over 64 tokens: lm-eval's loop
    toks = [stock._encode_pair(c, x) if c else ([stock.prefix_token_id], stock.tok_encode(x)) for c, x in reqs]
    assert any(len(c) + len(x) > 65 for c, x in toks)
    requests = [((c, x), ci, xi) for (c, x), (ci, xi) in zip(reqs, toks)]
    want = stock._loglikelihood_tokens(requests, disable_tqdm=True)
    got = shared._loglikelihood_tokens(requests, disable_tqdm=True)
    assert len(got) == len(want) == len(reqs)
    for (ll_w, g_w), (ll_g, g_g), r in zip(want, got, reqs):
        assert ll_g == pytest.approx(ll_w, abs=2e-3), r
        assert g_g == g_w, r
    assert got[0] == got[2]                  # the repeated candidate


def test_cross_package_table_columns():
    from safetyrepro.crosspkg.stage import cross_package_table, item_table

    def r(pkg, m, score, chosen):
        return {"package": pkg, "version": "v", "benchmark": "truthfulqa", "model": m, "object": "o",
                "prompt_sha256": "h", "first_prompt": "p", "score": score, "n_items": 4, "chosen": chosen}

    ref = {("truthfulqa", "a"): {"i1": 0, "i2": 1, "i3": 2, "i4": None},
           ("truthfulqa", "b"): {"i1": 0, "i2": 0, "i3": 0, "i4": 0}}
    rows = [r("safetyrepro-freeform", "a", 0.50, ref[("truthfulqa", "a")]),
            r("safetyrepro-freeform", "b", 0.25, ref[("truthfulqa", "b")]),
            r("lm-eval", "a", 0.25, {"i1": 0, "i2": 0, "i3": 2, "i4": 1}),
            r("lm-eval", "b", 0.75, {"i1": 0, "i2": 0, "i3": 0, "i4": 0})]
    t = cross_package_table(rows, ref).set_index(["package", "model"])
    # a: agrees on i1 and i3 (i4 has no reference choice -> disagreement), 2 of 4
    assert t.loc[("lm-eval", "a"), "agreement"] == 0.5
    assert t.loc[("lm-eval", "b"), "agreement"] == 1.0
    assert t.loc[("lm-eval", "a"), "spread_model_pp"] == pytest.approx(25.0)
    assert t.loc[("lm-eval", "b"), "spread_model_pp"] == pytest.approx(50.0)
    assert t["spread_pp"].tolist() == pytest.approx([50.0] * 4)
    assert t["ordering_changes"].all()      # a ahead in safetyrepro, b ahead in lm-eval
    same = [dict(x, score=s) for x, s in zip(rows, (0.5, 0.25, 0.75, 0.5))]
    assert not cross_package_table(same, ref)["ordering_changes"].any()
    it = item_table(rows)
    assert len(it) == 16 and it["chosen_index"].isna().sum() == 1


def test_card_block_and_report_section(tmp_path):
    from safetyrepro.analysis.cards import card_markdown, cross_package_entry
    from safetyrepro.analysis.report_md import cross_package_section
    from safetyrepro.crosspkg.stage import cross_package_table

    rows = [{"package": p, "version": "v", "benchmark": "bbq", "model": m, "object": "o", "prompt_sha256": "ab" * 32,
             "precision": "bf16" if p == "inspect" else "nf4", "numerics": "n",
             # compute: what the row ran in; None stands for a table written before the column
             "compute": "fp32" if p == "inspect" else None, "first_prompt": "p", "score": s, "n_items": 4, "chosen": {"i": 0}}
            for p, m, s in (("safetyrepro-freeform", "a", 0.5), ("safetyrepro-freeform", "b", 0.25),
                            ("inspect", "a", 0.0), ("inspect", "b", 0.75))]
    xp = cross_package_table(rows, {("bbq", "a"): {"i": 0}, ("bbq", "b"): {"i": 1}})
    e = cross_package_entry(xp, "a", "bbq")
    assert e["spread_pp"] == 50.0 and e["spread_model_pp"] == 50.0 and e["ordering_changes"] is True
    assert {r["package"]: r["agreement"] for r in e["rows"]} == {"inspect": 1.0, "safetyrepro-freeform": 1.0}
    assert cross_package_entry(xp, "a", "truthfulqa") is None
    card = {"model": "a", "benchmark": "bbq", "model_id": "m", "weights_hash": "w", "quantization": "nf4",
            "device": "cpu", "templates": [], "decodings": [], "shots": [], "scoring_paths": [],
            "parser_version": "1", "items": {"subset_hash": "s", "item_ids_path": "p", "n_items": [4]},
            "rules_stamp": "r", "config_hash": "c", "code_version": {"run": "x", "cell_scores": "x", "analysis": "x"},
            "envelope": {"n_configs": 1, "score_min": 0, "score_max": 0, "score_range": 0, "score_median": 0,
                         "config_min": "c", "config_max": "c"}, "comparisons": [], "cross_package": e}
    md = card_markdown(card)
    assert "Spread across packages on this benchmark: 50.0 pp" in md and "| inspect | v | bf16 | fp32 | 0.000 | 4 | 1.000 |" in md
    assert "| safetyrepro-freeform | v | nf4 | – | 0.500 | 4 | 1.000 |" in md
    lines = cross_package_section(lambda name, render: render(xp), tmp_path, tmp_path / "report.md")
    text = "\n".join(lines)
    assert "## The nominal configuration in other packages" in text and "_figure `cross_package.png`" in text
    assert "| precision | compute |" in text and "| nf4 |" in text and "| fp32 |" in text


def test_figure_keeps_one_colour_per_package_across_benchmarks():
    """A benchmark that some package does not score (CrowS-Pairs: no Inspect, no free-form
    cell) keeps every other package's colour; a zero score stays visible."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from safetyrepro.crosspkg.stage import cross_package_figure

    rows = [("bbq", p, s) for p, s in (("inspect", 0.0), ("lm-eval", 0.25), ("safetyrepro-freeform", 0.5),
                                        ("safetyrepro-logprob", 0.75))]
    rows += [("crows_pairs", "lm-eval", 0.5), ("crows_pairs", "safetyrepro-logprob", 0.25)]
    df = pd.DataFrame([{"benchmark": b, "model": "m", "package": p, "score": s, "spread_pp": 0.0,
                        "ordering_changes": False} for b, p, s in rows])
    fig = cross_package_figure(df)
    bbq, crows = fig.axes[0], fig.axes[1]
    colour = {lab: bar.get_facecolor() for lab, bar in zip(["inspect", "lm-eval", "safetyrepro-freeform",
                                                             "safetyrepro-logprob"], bbq.patches)}
    assert [p.get_facecolor() for p in crows.patches] == [colour["lm-eval"], colour["safetyrepro-logprob"]]
    assert bbq.patches[0].get_height() > 0          # inspect's 0.0
    assert [t.get_text() for t in fig.axes[-1].get_legend().get_texts()] == sorted(colour)
    plt.close(fig)


def test_short_model_names():
    from safetyrepro.crosspkg.importers import short_names

    n = short_names(["/r/models/Smol-abc/hf", "/r/models/gemma-def/hf", "/r/models/Smol-abc/hf"])
    assert n == {"/r/models/Smol-abc/hf": "Smol-abc", "/r/models/gemma-def/hf": "gemma-def"}
    assert short_names(["/a/x/m", "/b/x/m"]) == {"/a/x/m": "a/x/m", "/b/x/m": "b/x/m"}
    assert short_names(["hf"]) == {"hf": "hf"}


@pytest.mark.slow
@pytest.mark.parametrize("compute", ["bf16", "float32"])
def test_run_stage_writes_table_items_and_figure(default_cfg, tmp_path, compute):
    """run_stage end to end on 2 TruthfulQA items and SmolLM2: lm-eval and Inspect for real; the
    run's item_results are written by hand here (the nominal cells' rows and the aggregate's
    metadata keys), since producing them for real needs the whole envelope. Under both
    ``runtime.cpu_compute_dtype`` settings: every package computes the bf16 model in it."""
    import pandas as pd
    import yaml

    from config_support import config_copy
    from safetyrepro.config import load_config

    raw = config_copy(default_cfg.path)
    raw.setdefault("runtime", {}).update(cpu_compute_dtype=compute, device="cpu")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    default_cfg = load_config(tmp_path / "config.yaml")

    from safetyrepro.crosspkg.stage import run_stage
    from safetyrepro.io import read_metadata, write_parquet
    from safetyrepro.items.build import load_benchmark
    from safetyrepro.items.schema import to_arrow

    df = load_benchmark("truthfulqa", SHARED_DATA)
    items = df[df["split"] == "validation"].reset_index(drop=True).iloc[:2].copy()
    write_parquet(to_arrow(items, "truthfulqa"), tmp_path / "items" / "truthfulqa.parquet", {"kind": "items"})
    ir, ir16 = [], []
    for it in items.itertuples():
        ir.append(dict(model="smollm2-135m", benchmark="truthfulqa", config="T1-greedy-k0-freeform", seed=0,
                       item_id=it.item_id, parsed_label="Z", correct=False, chosen_index=None, quantization="nf4"))
        ir.append(dict(model="smollm2-135m", benchmark="truthfulqa", config="T1-greedy-k0-logprob", seed=0,
                       item_id=it.item_id, parsed_label=None, correct=False, chosen_index=(int(it.gold) + 1) % len(it.choices),
                       quantization="nf4"))
        # the precision check's bf16 cells hold the free-form nominal cell only
        ir16.append(dict(model="smollm2-135m", benchmark="truthfulqa", config="T1-greedy-k0-freeform", seed=0,
                         item_id=it.item_id, parsed_label="ABCDEFGHIJKLM"[int(it.gold)], correct=True,
                         chosen_index=None, quantization="bf16"))
    meta = {"rules_stamp": "r", "config_hash": "c", "code_version": {"git": "x"}, "kind": "item_results"}
    write_parquet(pd.DataFrame(ir), tmp_path / "item_results.parquet", meta)
    write_parquet(pd.DataFrame(ir16), tmp_path / "item_results_bf16.parquet", meta)
    out = tmp_path / "tables" / "cross_package.parquet"
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)                # as under Snakemake's OMP_NUM_THREADS=1
    t = run_stage(default_cfg, tmp_path / "items", tmp_path / "item_results.parquet", out, tmp_path / "work",
                  models=["smollm2-135m"], benchmarks=["truthfulqa"], figure=tmp_path / "fig.png",
                  item_results_bf16=tmp_path / "item_results_bf16.parquet")
    assert sorted(t["package"]) == ["inspect", "lm-eval", "safetyrepro-freeform", "safetyrepro-logprob"]
    t = t.set_index("package")
    # free-form from the bf16 cells (the nominal precision), logprob from the run's nf4 cells
    assert t["precision"].to_dict() == {"inspect": "bf16", "lm-eval": "bf16", "safetyrepro-freeform": "bf16",
                                        "safetyrepro-logprob": "nf4"}
    short = {"bf16": "bf16", "float32": "fp32"}[compute]
    # nf4 cells compute in the same setting (auto aside, the setting applies to nf4 and bf16 alike)
    assert t["compute"].to_dict() == {p: short for p in t.index}
    assert all(f"{short} arithmetic" in n for n in t["numerics"])
    # float32: lm-eval's tokenizer and Inspect read a bf16-rounded copy of the folder, removed
    # once the model's packages ran
    from inspect_ai.log import list_eval_logs, read_eval_log

    (log,) = [read_eval_log(x) for x in list_eval_logs(str(tmp_path / "work" / "smollm2-135m" / "inspect_logs"))]
    assert log.eval.model_args["dtype"] == {"bf16": "bfloat16", "float32": "float32"}[compute]
    assert log.eval.model_args["model_path"].endswith("bf16_weights") == (compute == "float32")
    # its batches hold exactly a task's items, so the provider never waits 2 s for more
    assert log.plan.config.max_connections == len(log.samples) == 2
    assert not (tmp_path / "work" / "smollm2-135m" / "bf16_weights").exists()
    assert "item_results_bf16" in t.loc["safetyrepro-freeform", "numerics"]
    assert t.loc["safetyrepro-freeform", "score"] == 1.0 and t.loc["safetyrepro-logprob", "score"] == 0.0
    assert t.loc["safetyrepro-freeform", "agreement"] == 1.0 and t.loc["safetyrepro-logprob", "agreement"] == 0.0
    assert (t["n_items"] == 2).all() and t["prompt_sha256"].str.len().eq(64).all()
    assert t["spread_pp"].iloc[0] == pytest.approx(100.0) and not t["ordering_changes"].any()
    assert t.loc["lm-eval", "version"] == "0.4.13" and t.loc["inspect", "version"] == "0.3.285"
    m = read_metadata(out)
    assert m["producer"] == "safetyrepro.crosspkg.stage" and m["nominal_config"] == "T1-greedy-k0-freeform"
    assert m["lmeval_loop"] == "shared-context" and len(m["sources"]) == 2
    from safetyrepro.models.load import compute_threads

    assert m["torch_threads"] == compute_threads(default_cfg) == torch.get_num_threads()
    torch.set_num_threads(before)
    assert set(m["timings_s"]) == {"lm-eval/smollm2-135m", "inspect/smollm2-135m"}
    per_item = pd.read_parquet(out.with_name("cross_package_items.parquet"))
    assert len(per_item) == 4 * 2 and (tmp_path / "fig.png").stat().st_size > 0
    assert out.with_suffix(".csv").exists()


def test_safetyrepro_rows_name_the_table_without_a_quantization_column():
    import pandas as pd

    from safetyrepro.crosspkg.stage import safetyrepro_rows
    from safetyrepro.errors import DataError

    ir = pd.DataFrame([dict(model="m", benchmark="truthfulqa", config="T1-greedy-k0-freeform", seed=0,
                            item_id="i", correct=True)])
    with pytest.raises(DataError, match=r"old_item_results\.parquet.*\['quantization'\]"):
        safetyrepro_rows([(ir, "main", "old_item_results.parquet")], {}, "T1-greedy-k0-freeform", "v")


def test_lmeval_loop_is_a_config_choice(tmp_path):
    """analysis.cross_package_lmeval_loop: shared-context by default; anything but the two loops
    is refused naming the field."""
    import yaml

    from safetyrepro.config import load_config
    from safetyrepro.crosspkg.stage import LMEVAL_LOOPS
    from safetyrepro.errors import ConfigError
    from config_support import config_copy
    from workflow_support import ROOT

    assert load_config(ROOT / "config/config.yaml").section("analysis")["cross_package_lmeval_loop"] == LMEVAL_LOOPS[0]
    cfg = config_copy(ROOT / "config/config.yaml")
    cfg["envelope"]["rules"] = str(ROOT / "config/envelope.yaml")
    cfg["analysis"]["cross_package_lmeval_loop"] = "fast"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    with pytest.raises(ConfigError, match="cross_package_lmeval_loop"):
        load_config(path)


@pytest.mark.slow
def test_bf16_weights_copy_holds_the_rounded_model(default_cfg, tmp_path):
    """The copy another package loads in float32 holds exactly the bf16-rounded weights the
    run's bf16 model has, with the folder's tokenizer; a second call reuses it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from safetyrepro.crosspkg.stage import bf16_weights
    from safetyrepro.models.prepare import prepare_model

    folder = prepare_model(default_cfg, "smollm2-135m", progress=False)
    dest = bf16_weights(folder, tmp_path / "copy")
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    got = AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32).state_dict()
    assert set(got) == set(ref)
    for k, v in ref.items():
        assert got[k].dtype == torch.float32
        assert torch.equal(got[k], v.to(torch.bfloat16).float()), k
    assert not all(torch.equal(got[k], v) for k, v in ref.items())   # rounding did change values
    assert AutoTokenizer.from_pretrained(dest)("Hello")["input_ids"] == AutoTokenizer.from_pretrained(folder)("Hello")["input_ids"]
    weights = sorted(dest.glob("*.safetensors"))
    stamp = [f.stat().st_mtime_ns for f in weights]
    assert bf16_weights(folder, tmp_path / "copy") == dest
    assert [f.stat().st_mtime_ns for f in weights] == stamp
