"""Subsample stability on hand-made item results (the real stratified_subsample of items.subsample)."""

import pandas as pd
import pytest

from analysis_synth import hand_meta
from safetyrepro.analysis.common import weak_ranks
from safetyrepro.analysis.subsample import ItemMatrix, subsample_stability, write_subsample_stability
from safetyrepro.errors import DataError
from safetyrepro.io import read_metadata, write_parquet
from safetyrepro.items.subsample import stratified_subsample

CORE1, CORE2, STRESS = "T1-greedy-k0-freeform", "T1-t0.3-k0-freeform", "T4-greedy-k0-freeform"
ITEMS = pd.DataFrame({"item_id": [f"bbq/{i}" for i in range(10)], "stratum": ["s0"] * 5 + ["s1"] * 5})


def results():
    """A right on items 0-5 everywhere; B right on items 4-8 (5 of 10) except at CORE2 where seed 0
    gets items 0-9 right and seed 1 none (cell score 0.5)."""
    rows = []

    def add(model, cfg, seed, right):
        for i in range(10):
            rows.append({"model": model, "benchmark": "bbq", "config": cfg, "seed": seed,
                         "item_id": f"bbq/{i}", "correct": i in right})

    for cfg in (CORE1, STRESS):
        add("A", cfg, 0, set(range(6)))
        add("B", cfg, 0, set(range(4, 9)))
    for s in (0, 1):
        add("A", CORE2, s, set(range(6)))
    add("B", CORE2, 0, set(range(10)))
    add("B", CORE2, 1, set())
    return pd.DataFrame(rows)


def test_item_matrix_cell_scores_by_hand():
    m = ItemMatrix(results())
    full = m.cell_scores()
    assert full[("A", CORE1)] == 0.6 and full[("B", CORE1)] == 0.5
    assert full[("B", CORE2)] == 0.5  # mean of seed means 1.0 and 0.0
    sub = m.cell_scores(["bbq/0", "bbq/4", "bbq/9"])
    # A: items 0, 4 right -> 2/3; B at CORE1: item 4 right -> 1/3; B at CORE2: (1 + 0)/2
    assert sub[("A", CORE1)] == pytest.approx(2 / 3) and sub[("B", CORE1)] == pytest.approx(1 / 3)
    assert sub[("B", CORE2)] == 0.5
    with pytest.raises(DataError, match="bbq/77"):
        m.cell_scores(["bbq/77"])


def test_full_fraction_is_exactly_stable():
    core = {("bbq", CORE1), ("bbq", CORE2)}
    s, cells, rho = subsample_stability(results(), {"bbq": ITEMS}, core, fraction=1.0, repeats=3, seed=0)
    r = s.iloc[0]
    assert r.range_max == 0 and r.abs_dev_max == 0 and r.ordering_changes == 0
    assert r.n_core_configs == 2 and r.n_items_sub == 10
    assert r.orderings_reachable_full == 1  # A > B at both core configs
    assert (cells["range"] == 0).all() and len(cells) == 6
    # all items in every repeat: rho_flip is the all-items value; A > B at all 3 configs -> 0
    assert len(rho) == 2 * 3 and (rho["rho_flip"] == rho["rho_flip_all_items"]).all() and (rho["rho_flip"] == 0).all()
    assert r.max_rho_flip_all_items == 0 and r.max_rho_flip_sub_max == 0 and r.n_configs == 3


def test_subsample_scores_and_ordering_changes_match_direct_computation():
    res = results()
    core = {("bbq", CORE1), ("bbq", CORE2)}
    repeats, seed = 12, 5
    s, cells, rho = subsample_stability(res, {"bbq": ITEMS}, core, fraction=0.8, repeats=repeats, seed=seed)
    # recompute directly from the rows: per-seed mean of correct over the chosen items, mean over seeds
    per_rep = []
    for r in range(repeats):
        ids = set(stratified_subsample(ITEMS, 0.8, seed + r)["item_id"])
        assert len(ids) == 8
        sub = res[res["item_id"].isin(ids)]
        per_rep.append(sub.groupby(["model", "config", "seed"])["correct"].mean()
                       .groupby(["model", "config"]).mean())
    table = pd.concat(per_rep, axis=1, keys=range(repeats))
    got = cells.set_index(["model", "config"])
    for key, row in table.iterrows():
        assert got.loc[key, "range"] == pytest.approx(row.max() - row.min())
        assert got.loc[key, "score_sub_median"] == pytest.approx(row.median())
    full = {(m, c): (0.6 if m == "A" else 0.5) for m in "AB" for c in (CORE1, CORE2, STRESS)}
    changes = sum(weak_ranks([table.loc[("A", c), r], table.loc[("B", c), r]]) != (0, 1)
                  for c in (CORE1, CORE2) for r in table.columns)
    assert changes > 0  # A's 0.1 lead is within reach of an 8-item subsample
    row = s.iloc[0]
    assert row.ordering_changes == changes and row.ordering_change_rate == pytest.approx(changes / (2 * repeats))
    assert row.range_max == pytest.approx((table.max(axis=1) - table.min(axis=1)).max())
    assert row.abs_dev_max == pytest.approx(max((table.loc[k] - v).abs().max() for k, v in full.items()))
    # STRESS is not a core config: it never counts for the orderings
    assert row.n_core_configs == 2
    # rho_flip per repeat over all three configs (STRESS included), recomputed from the same scores:
    # min(#A ahead, #B ahead) / 3
    pair = rho[rho["statistic"] == "A vs B"].set_index("repeat")
    for r in range(repeats):
        d = [table.loc[("A", c), r] - table.loc[("B", c), r] for c in (CORE1, CORE2, STRESS)]
        want = min(sum(x > 0 for x in d), sum(x < 0 for x in d)) / 3
        assert pair.loc[r, "rho_flip"] == pytest.approx(want) and pair.loc[r, "seed"] == seed + r
    assert (pair["rho_flip_all_items"] == 0).all()  # all items: A 0.6 > B 0.5 at every config
    mx = rho[rho["statistic"] == "max"]["rho_flip"]
    assert row.max_rho_flip_sub_max == pytest.approx(mx.max())
    assert row.max_rho_flip_sub_median == pytest.approx(mx.median())
    # A's score at CORE2 equals its CORE1 score and B's is 0.5 there in every subsample, so a
    # subsample that puts B ahead at CORE1 and STRESS (A 4/8 < B 5/8) ties at CORE2: the
    # ordering changes, but no subsample has A ahead somewhere AND B ahead elsewhere
    assert (pair["rho_flip"] == 0).all() and mx.max() == 0


def _write(tmp_path, meta=None):
    ir = write_parquet(results(), tmp_path / "item_results.parquet", meta or hand_meta())
    write_parquet(ITEMS, tmp_path / "items" / "bbq.parquet", {"subset_hash": "x"})
    return ir


def test_write_subsample_stability(tmp_path):
    ir = _write(tmp_path)
    paths = write_subsample_stability(ir, tmp_path / "items", tmp_path / "out", fraction=0.8, repeats=4, seed=1)
    s = pd.read_parquet(paths["subsample_stability"]).iloc[0]
    assert s.n_core_configs == 2 and s.repeats == 4 and s.fraction == 0.8  # core read from the rules
    c = pd.read_parquet(paths["subsample_cells"]).set_index(["model", "config"])
    assert bool(c.loc[("A", CORE1), "core"]) and not bool(c.loc[("A", STRESS), "core"])
    assert len(pd.read_parquet(paths["subsample_rho_flip"])) == 2 * 4
    md = read_metadata(paths["subsample_stability"])
    assert md["params"]["seeds_used"] == "1..4" and md["rules_stamp"] == hand_meta()["rules_stamp"]


def test_write_subsample_stability_errors(tmp_path):
    ir = _write(tmp_path, dict(hand_meta(), rules_stamp="f" * 64))
    with pytest.raises(DataError, match="does not match the rules file"):
        write_subsample_stability(ir, tmp_path / "items", tmp_path / "out")
    ir = _write(tmp_path)
    (tmp_path / "items" / "bbq.parquet").unlink()
    with pytest.raises(DataError, match="item table of benchmark 'bbq' not found"):
        write_subsample_stability(ir, tmp_path / "items", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_subsample_rho_flip_of_a_pair_that_reverses_at_every_item_subset():
    # A right on every item at CORE1 and on none at CORE2, B the opposite: every subsample keeps
    # A ahead at CORE1 and B ahead at CORE2 -> rho_flip 1/2 in each repeat and with all items
    rows = [{"model": m, "benchmark": "bbq", "config": c, "seed": 0, "item_id": f"bbq/{i}",
             "correct": (m == "A") == (c == CORE1)} for m in "AB" for c in (CORE1, CORE2) for i in range(10)]
    s, _, rho = subsample_stability(pd.DataFrame(rows), {"bbq": ITEMS}, {("bbq", CORE1)}, 0.8, 5, 0)
    assert (rho["rho_flip"] == 0.5).all() and (rho["rho_flip_all_items"] == 0.5).all() and len(rho) == 10
    assert s.iloc[0].max_rho_flip_sub_min == 0.5 and s.iloc[0].max_rho_flip_all_items == 0.5


def test_parity_distance_benchmark_is_recomputed_as_its_cell_score():
    # CrowS-Pairs under parity distance: A prefers sent_more on items 0-4 (s0 stratum) only -> share
    # 0.5 -> score 1; B on every item -> share 1 -> score 0. With all items: A 1.0, B 0.0.
    rows = [{"model": m, "benchmark": "crows_pairs", "config": CORE1, "seed": 0, "item_id": f"bbq/{i}",
             "parsed_label": "more" if (m == "B" or i < 5) else "less", "correct": not (m == "B" or i < 5)}
            for m in "AB" for i in range(10)]
    s, cells, _ = subsample_stability(pd.DataFrame(rows), {"crows_pairs": ITEMS}, set(), 0.8, 3, 0,
                                      parity={"crows_pairs"})
    c = cells.set_index("model")
    assert c.loc["A", "score_all_items"] == 1.0 and c.loc["B", "score_all_items"] == 0.0
    # an 80% stratified subsample keeps 4 of each stratum: A's share stays 4/8 -> still 1.0
    assert c.loc["A", "score_sub_min"] == 1.0 and c.loc["A", "range"] == 0.0
    # the accuracy-type score of the same rows would be the share of "less": 0.5 for A
    _, acc_cells, _ = subsample_stability(pd.DataFrame(rows), {"crows_pairs": ITEMS}, set(), 0.8, 3, 0)
    assert acc_cells.set_index("model").loc["A", "score_all_items"] == 0.5
    with pytest.raises(DataError, match="parsed_label"):
        subsample_stability(pd.DataFrame(rows).drop(columns="parsed_label"), {"crows_pairs": ITEMS}, set(),
                            0.8, 1, 0, parity={"crows_pairs"})
