"""BF16 vs NF4 comparison and GRID cards on hand-made tables."""

import json

import pandas as pd
import pytest

from analysis_synth import hand_cells, hand_meta, write_hand
from safetyrepro.analysis.cards import build_cards, card_markdown, load_provenance, verdict, write_cards
from safetyrepro.analysis.common import weak_ranks
from safetyrepro.analysis.precision import precision_check, write_precision_check
from safetyrepro.errors import ConfigError, DataError
from safetyrepro.rules import load_rules

K1, K2, K3, K4 = ("T1-greedy-k0-freeform", "T2-greedy-k0-freeform", "T1-greedy-k3-freeform",
                  "T2-greedy-k3-freeform")  # the four conservative_core configs
OUTSIDE = ["T3-greedy-k0-freeform", "T1-greedy-k0-logprob"]

MAIN = {K1: (0.8, 0.6, 0.4), K2: (0.7, 0.5, 0.3), K3: (0.6, 0.6, 0.2), K4: (0.5, 0.4, 0.3)}
BF16 = {K1: (0.81, 0.6, 0.4),   # |diff| .01, 0, 0      same order
        K2: (0.5, 0.55, 0.3),   # |diff| .2, .05, 0     B now ahead of A: order differs
        K3: (0.6, 0.6, 0.25),   # |diff| 0, 0, .05      A = B tie kept: same order
        K4: (0.5, 0.4, None)}   # C missing: 2 cells paired, config not comparable


def tables():
    main = [(m, "bbq", c, s) for c, ss in MAIN.items() for m, s in zip("ABC", ss)]
    main += [(m, "bbq", c, 0.1 * i) for c in OUTSIDE for i, m in enumerate("ABC")]
    main += [(m, "crows_pairs", "T1-greedy-k0-logprob", 0.5) for m in "ABC"]
    bf = [(m, "bbq", c, s) for c, ss in BF16.items() for m, s in zip("ABC", ss) if s is not None]
    bf += [(m, "bbq", OUTSIDE[0], 0.9) for m in "ABC"]  # outside the sub-envelope: ignored
    return hand_cells(main), hand_cells(bf, quantization="bf16")


def test_weak_ranks():
    assert weak_ranks([0.8, 0.6, 0.4]) == (0, 1, 2)
    assert weak_ranks([0.6, 0.6, 0.2]) == (0, 0, 2)
    assert weak_ranks([0.6, 0.61, 0.2], tol=0.02) == (0, 0, 2)


def test_precision_check_by_hand():
    main, bf = tables()
    summary, cells = precision_check(main, bf, load_rules())
    # CrowS-Pairs' T1-greedy-k0-logprob is a precision-check config: in the main table only here
    assert list(summary["benchmark"]) == ["bbq", "crows_pairs", "ALL"]
    assert summary.set_index("benchmark").loc["crows_pairs", "n_cells_main_only"] == 3
    s = summary.set_index("benchmark").loc["bbq"]
    assert s.n_cells_paired == 11 and s.n_cells_main_only == 1 and s.n_cells_bf16_only == 0
    # 11 |diffs|: seven 0, .01, .05, .05, .2
    assert s.abs_diff_median == pytest.approx(0.0, abs=1e-12)
    assert s.abs_diff_mean == pytest.approx(0.31 / 11) and s.abs_diff_max == pytest.approx(0.2)
    assert (s.n_configs_paired, s.n_orderings_match) == (3, 2)
    assert s.share_orderings_match == pytest.approx(2 / 3)
    assert (s.quantization_main, s.quantization_bf16) == ("nf4", "bf16")
    assert summary.set_index("benchmark").loc["ALL", "n_cells_paired"] == 11
    assert set(cells["config"]) == {K1, K2, K3, K4} and len(cells) == 11
    assert s.orderings_agree == "2 of 3"


def test_precision_check_pairs_crows_pairs_zero_shot_logprob_configs():
    # CrowS-Pairs has no free-form path: its T1/T2 zero-shot logprob configs are checked
    # (the paper's 18th and 17th pairs), its 3-shot and T3 ones are not
    main, bf = tables()
    crows = {"T1-greedy-k0-logprob": ((0.5, 0.5, 0.5), (0.6, 0.5, 0.4)),   # tie -> strict: differs
             "T2-greedy-k0-logprob": ((0.7, 0.5, 0.3), (0.65, 0.5, 0.35)),  # same order
             "T1-greedy-k3-logprob": ((0.1, 0.2, 0.3), (0.9, 0.9, 0.9)),    # outside the check
             "T3-greedy-k0-logprob": ((0.1, 0.2, 0.3), (0.9, 0.9, 0.9))}
    main = main[main["benchmark"] != "crows_pairs"]
    main = pd.concat([main, hand_cells([(m, "crows_pairs", c, s) for c, (ss, _) in crows.items()
                                        for m, s in zip("ABC", ss)])], ignore_index=True)
    bf = pd.concat([bf, hand_cells([(m, "crows_pairs", c, s) for c, (_, ss) in crows.items()
                                    for m, s in zip("ABC", ss)], quantization="bf16")], ignore_index=True)
    summary, cells = precision_check(main, bf, load_rules())
    s = summary.set_index("benchmark")
    c = s.loc["crows_pairs"]
    assert (c.n_cells_paired, c.n_cells_main_only, c.n_cells_bf16_only) == (6, 0, 0)
    # |diffs| .1, 0, .1, .05, 0, .05
    assert c.abs_diff_median == pytest.approx(0.05) and c.abs_diff_mean == pytest.approx(0.3 / 6)
    assert c.abs_diff_max == pytest.approx(0.1) and c.orderings_agree == "1 of 2"
    a = s.loc["ALL"]
    assert a.n_cells_paired == 17 and a.abs_diff_max == pytest.approx(0.2)
    assert (a.n_configs_paired, a.n_orderings_match, a.orderings_agree) == (5, 3, "3 of 5")
    assert set(cells.loc[cells["benchmark"] == "crows_pairs", "config"]) == {
        "T1-greedy-k0-logprob", "T2-greedy-k0-logprob"}


def test_write_precision_check(tmp_path):
    main, bf = tables()
    bf_complete = bf[bf["config"] != K4]  # (the loader would drop the incomplete K4 anyway)
    pm = write_hand(main, tmp_path / "main.parquet")
    pb = write_hand(bf_complete, tmp_path / "bf16.parquet")
    paths = write_precision_check(pm, pb, tmp_path / "out")
    s = pd.read_parquet(paths["precision"]).set_index("benchmark")
    assert s.loc["bbq", "n_cells_paired"] == 9 and s.loc["bbq", "n_cells_main_only"] == 3
    assert len(pd.read_parquet(paths["precision_cells"])) == 9
    # a BF16 table from other rules is refused
    meta = dict(hand_meta(), rules_stamp="0" * 64)
    other = write_hand(bf_complete, tmp_path / "other.parquet", meta)
    with pytest.raises(DataError, match="different envelope rules"):
        write_precision_check(pm, other, tmp_path / "out2")
    # nothing to pair
    none = write_hand(hand_cells([(m, "bbq", OUTSIDE[0], 0.5) for m in "ABC"]), tmp_path / "none.parquet")
    with pytest.raises(DataError, match=r"no precision-check \(conservative_core\) cell pairs"):
        write_precision_check(pm, none, tmp_path / "out3")
    assert not (tmp_path / "out3").exists()


# ------------------------------------------------------------------------------ cards

def card_cells():
    # A vs B: A ahead in K1, K2, tied in K3 -> D1, not D2; A vs C: A ahead everywhere -> D2
    # B vs C: B ahead K1, behind K2, tied K3 -> flips, rho 1/3
    return hand_cells([("A", "bbq", K1, 0.9), ("B", "bbq", K1, 0.5), ("C", "bbq", K1, 0.1),
                       ("A", "bbq", K2, 0.8), ("B", "bbq", K2, 0.2), ("C", "bbq", K2, 0.3),
                       ("A", "bbq", K3, 0.6), ("B", "bbq", K3, 0.6), ("C", "bbq", K3, 0.6)])


def provenance(**override):
    rec = {"model_id": "org/m", "weights_hash": "w" * 64, "quantization": "nf4", "device": "cpu",
           "template_hashes": {"T1": "a" * 64, "T2": "b" * 64}, "parser_version": "p1",
           "subset_hash": "subset-bbq", "item_ids_path": "results/items/bbq.ids", "code_version": "0.1.0"}
    rec.update(override)
    return {m: {"bbq": dict(rec, model_id=f"org/{m}")} for m in "ABC"}


def test_verdict_words():
    assert verdict("A", "B", 3, 0, 0, 0.0).startswith("stable: A ahead of B in every config (D2")
    assert "behind or tied" in verdict("A", "B", 0, 2, 1, 0.0) and "D1, not D2" in verdict("A", "B", 0, 2, 1, 0.0)
    assert verdict("A", "B", 0, 0, 4, 0.0).startswith("tied with B")
    assert "flips" in verdict("A", "B", 2, 1, 0, 1 / 3) and "0.333" in verdict("A", "B", 2, 1, 0, 1 / 3)


def test_cards_content():
    cards = {c["model"]: c for c in build_cards(card_cells(), provenance(), hand_meta())}
    a = cards["A"]
    assert a["model_id"] == "org/A" and a["templates"] == [{"id": "T1", "text_hash": "a" * 64},
                                                           {"id": "T2", "text_hash": "b" * 64}]
    assert a["decodings"] == ["greedy"] and a["shots"] == ["k0", "k3"] and a["scoring_paths"] == ["freeform"]
    assert a["envelope"] == {"n_configs": 3, "score_min": 0.6, "score_max": 0.9, "score_range": pytest.approx(0.3),
                             "score_median": 0.8, "config_min": K3, "config_max": K1}
    assert a["rules_stamp"] == hand_meta()["rules_stamp"] and a["items"]["n_items"] == [10]
    vs = {c["other"]: c for c in a["comparisons"]}
    assert (vs["B"]["n_ahead"], vs["B"]["n_behind"], vs["B"]["n_tied"]) == (2, 0, 1)
    assert vs["B"]["d1"] and not vs["B"]["d2"]
    # A vs C: ahead in K1, K2, tied in K3 as well (all 0.6)
    assert vs["C"]["d1"] and not vs["C"]["d2"]
    c = {x["other"]: x for x in cards["C"]["comparisons"]}
    # C's view of B: behind in K1, ahead in K2, tied K3 -> flips, rho 1/3
    assert (c["B"]["n_ahead"], c["B"]["n_behind"]) == (1, 1) and c["B"]["rho_flip"] == pytest.approx(1 / 3)
    assert c["B"]["verdict"].startswith("flips: C ahead in 1, behind in 1")


def test_cards_disclose_chat_template_numerics_and_batches():
    rec = {"chat_template_hash": "c" * 64, "numerics": {"dtype": "bfloat16", "attention": "sdpa"},
           "batching": {"batch_size_caps": [32], "largest_batch_prompts": 12, "memory_plans": 4,
                        "oom_splits": 2}}
    a = {c["model"]: c for c in build_cards(card_cells(), provenance(**rec), hand_meta())}["A"]
    assert a["chat_template_hash"] == "c" * 64 and a["batching"]["oom_splits"] == 2
    md = card_markdown(a)
    assert f"| chat template | `{'c' * 64}` |" in md
    assert "| numerics | dtype bfloat16; attention sdpa |" in md
    assert "batch_size cap 32; largest planned batch 12 prompts over 4 memory plans; out-of-memory splits 2" in md
    # a provenance file from elsewhere without them: the card says so instead of dropping the rows
    md = card_markdown({c["model"]: c for c in build_cards(card_cells(), provenance(), hand_meta())}["A"])
    assert "| chat template | not recorded |" in md and "| batches | not recorded |" in md


def test_cards_input_errors():
    with pytest.raises(ConfigError, match=r"A\.bbq.*missing field\(s\) \['device'\]"):
        p = provenance()
        del p["A"]["bbq"]["device"]
        build_cards(card_cells(), p, hand_meta())
    with pytest.raises(ConfigError, match="no text hash for template"):
        build_cards(card_cells(), provenance(template_hashes={"T1": "x"}), hand_meta())
    with pytest.raises(DataError, match="quantization"):
        build_cards(card_cells(), provenance(quantization="bf16"), hand_meta())
    with pytest.raises(ConfigError, match="no provenance record"):
        p = provenance()
        del p["C"]
        build_cards(card_cells(), p, hand_meta())


def test_provenance_forms_and_write_cards(tmp_path):
    nested = provenance()
    flat = {(m, b): rec for m, d in nested.items() for b, rec in d.items()}
    assert load_provenance(flat) == load_provenance(nested)
    prov_file = tmp_path / "prov.json"
    prov_file.write_text(json.dumps(nested))
    assert load_provenance(prov_file) == load_provenance(nested)
    src = write_hand(card_cells(), tmp_path / "cs.parquet")
    paths = write_cards(src, prov_file, tmp_path / "cards")
    assert set(paths) == {f"{m}__bbq.{e}" for m in "ABC" for e in ("json", "md")} | {"index"}
    card = json.loads(paths["B__bbq.json"].read_text())
    assert card["model"] == "B" and card["config_hash"] == hand_meta()["config_hash"]
    md = paths["B__bbq.md"].read_text()
    assert "# GRID card: B on bbq" in md and "| rules stamp |" in md and "flips" in md
    index = json.loads(paths["index"].read_text())
    assert len(index["cards"]) == 3 and index["rules_stamp"] == hand_meta()["rules_stamp"]


def test_cards_carry_the_precision_check(tmp_path):
    # card_cells() as the main run (K1-K3 of bbq); bf16: A moves by .1 in K1 (order kept),
    # B and C swap in K2 (order differs), K3 unchanged -> 2 of 3 orderings agree
    main = write_hand(card_cells(), tmp_path / "cs.parquet")
    bf = card_cells()
    bf["quantization"] = "bf16"
    bf.loc[(bf["model"] == "A") & (bf["config"] == K1), "score"] = 0.8
    bf.loc[(bf["model"] == "B") & (bf["config"] == K2), "score"] = 0.4
    prec = write_precision_check(main, write_hand(bf, tmp_path / "bf.parquet"), tmp_path / "tables")
    prov_file = tmp_path / "prov.json"
    prov_file.write_text(json.dumps(provenance()))
    paths = write_cards(main, prov_file, tmp_path / "cards", precision_path=prec["precision"])
    a = json.loads(paths["A__bbq.json"].read_text())["precision_check"]
    assert (a["n_cells"], a["orderings_agree"], a["quantization_main"]) == (3, "2 of 3", "nf4")
    assert a["abs_diff_max"] == pytest.approx(0.1) and a["abs_diff_median"] == pytest.approx(0.0)
    b = json.loads(paths["B__bbq.json"].read_text())["precision_check"]
    assert b["abs_diff_mean"] == pytest.approx(0.2 / 3)
    md = paths["A__bbq.md"].read_text()
    assert "## BF16 vs NF4 (precision check)" in md
    assert "median 0.000, mean 0.033, max 0.100; the model ordering on this benchmark agrees on 2 of 3" in md
    index = json.loads(paths["index"].read_text())
    assert [s["path"] for s in index["sources"]][1:] == [str(prec["precision"]), str(prec["precision_cells"])]
    # without the option the cards have no such block
    plain = write_cards(main, prov_file, tmp_path / "cards2")
    assert "precision_check" not in json.loads(plain["A__bbq.json"].read_text())
