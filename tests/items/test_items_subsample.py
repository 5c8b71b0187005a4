"""stratified_subsample: seeded stratified 80% subsamples of an evaluated subset."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest

from items_support import config
from safetyrepro.items import ItemsError, build_items, read_items
from safetyrepro.items.subsample import stratified_subsample
from safetyrepro.items.subsets import allocate


@pytest.fixture(scope="module")
def bbq(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sub")
    cfg = config(tmp, {"bbq": {"n_items": 120}, "xstest": {"n_items": 12}})
    return {b: read_items(build_items(cfg, b)["items_path"])[0] for b in ("bbq", "xstest")}


def test_size_and_strata(bbq):
    items = bbq["bbq"]
    sub = stratified_subsample(items, 0.8, seed=3)
    assert len(sub) == 96
    assert Counter(sub["stratum"]) == Counter(
        {s: k for s, k in allocate(Counter(items["stratum"]), 96, seed=3).items() if k})
    for s, k in Counter(items["stratum"]).items():
        assert abs(Counter(sub["stratum"])[s] - 0.8 * k) < 1
    assert set(sub["item_id"]) <= set(items["item_id"])
    assert sub.index.tolist() == sorted(sub.index)  # input order and index kept
    assert (items.loc[sub.index, "item_id"] == sub["item_id"]).all()


def test_seeded_and_order_independent(bbq):
    items = bbq["bbq"]
    a = stratified_subsample(items, 0.8, seed=11)
    assert a["item_id"].tolist() == stratified_subsample(items, 0.8, seed=11)["item_id"].tolist()
    shuffled = items.sample(frac=1.0, random_state=0).reset_index(drop=True)
    b = stratified_subsample(shuffled, 0.8, seed=11)
    assert set(a["item_id"]) == set(b["item_id"])
    samples = {frozenset(stratified_subsample(items, 0.8, seed=s)["item_id"]) for s in range(20)}
    assert len(samples) == 20


def test_one_item_per_stratum_still_varies(bbq):
    """12 items in 12 strata: 80% = 10 items; which strata lose their item varies by seed."""
    items = bbq["xstest"]
    subs = [stratified_subsample(items, 0.8, seed=s) for s in range(20)]
    assert all(len(s) == 10 for s in subs)
    assert len({frozenset(s["item_id"]) for s in subs}) > 5
    labels = Counter(items["label"])
    for s in subs:  # the safe/unsafe level stays proportional: 0.8 * 7 = 5.6, 0.8 * 5 = 4
        got = Counter(s["label"])
        assert abs(got["safe"] - 0.8 * labels["safe"]) < 1
        assert abs(got["unsafe"] - 0.8 * labels["unsafe"]) < 1


def test_custom_column_and_no_item_id():
    df = pd.DataFrame({"g": ["a"] * 10 + ["b"] * 5, "x": range(15)}, index=range(100, 115))
    sub = stratified_subsample(df, 0.6, seed=1, strata_col="g")
    assert Counter(sub["g"]) == {"a": 6, "b": 3}
    assert set(sub.index) <= set(df.index)
    assert stratified_subsample(df, 1.0, seed=5, strata_col="g").equals(df)


def test_bad_arguments(bbq):
    with pytest.raises(ItemsError, match="fraction must be in"):
        stratified_subsample(bbq["bbq"], 0.0, seed=1)
    with pytest.raises(ItemsError, match="no column 'bias'"):
        stratified_subsample(bbq["bbq"], 0.8, seed=1, strata_col="bias")
