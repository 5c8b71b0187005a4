"""Stratified, seeded, machine-independent subsets and few-shot pools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from items_support import DATA_DIR, config
from safetyrepro.items import ItemsError, KNOWN_BENCHMARKS, build_items, load_benchmark, read_items
from safetyrepro.items.schema import EVAL_SPLIT
from safetyrepro.items.subsets import allocate, check_disjoint, largest_remainder
from safetyrepro.paths import PROJECT_ROOT

PAPER = {b: {"n_items": 300} for b in KNOWN_BENCHMARKS}


# ------------------------------------------------------------------------ allocation
@given(sizes=st.lists(st.integers(1, 60), min_size=1, max_size=12), frac=st.floats(0, 1),
       seed=st.integers(0, 2**32))
@settings(max_examples=200, deadline=None)
def test_allocate_invariants(sizes, frac, seed):
    strata = {f"s{i:02d}": n for i, n in enumerate(sizes)}
    n = round(frac * sum(sizes))
    alloc = allocate(strata, n, seed=seed)
    assert sum(alloc.values()) == n
    assert all(0 <= alloc[s] <= strata[s] for s in strata)
    quota_ok = all(abs(alloc[s] - n * strata[s] / sum(sizes)) < 1 for s in strata)
    if n >= len(strata):
        assert min(alloc.values()) >= 1
        # plain largest remainder unless it would have left a stratum empty
        assert quota_ok or any(n * k < sum(sizes) for k in strata.values())
    else:
        assert quota_ok
    assert alloc == allocate(dict(reversed(strata.items())), n, seed=seed)


def test_largest_remainder_exact_integers():
    assert largest_remainder({"a": 1, "b": 1, "c": 1}, 2, tie=lambda k: k) == {
        "a": 1, "b": 1, "c": 0}
    assert largest_remainder({"a": 5, "b": 3}, 4, tie=lambda k: k) == {"a": 3, "b": 1}


def test_allocate_nested_levels_keep_top_level_proportional():
    sizes = {f"safe/t{i}": 25 for i in range(10)} | {f"unsafe/u{i}": 25 for i in range(8)}
    for seed in range(20):
        alloc = allocate(sizes, 12, seed=seed)
        by_label = Counter()
        for s, k in alloc.items():
            by_label[s.split("/")[0]] += k
        assert by_label == {"safe": 7, "unsafe": 5}  # 12*250/450 = 6.67, 5.33
        assert max(alloc.values()) == 1


def test_allocate_ties_depend_on_seed():
    sizes = {f"s{i}": 10 for i in range(6)}
    chosen = {tuple(sorted(s for s, k in allocate(sizes, 3, seed=seed).items() if k))
              for seed in range(30)}
    assert len(chosen) > 5


# --------------------------------------------------------------------- real subsets
@pytest.fixture(scope="module")
def paper_build(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("paper")
    cfg = config(tmp, PAPER)
    return cfg, {b: build_items(cfg, b) for b in KNOWN_BENCHMARKS}


@pytest.fixture(scope="module")
def paper_items(paper_build):
    cfg, summaries = paper_build
    return {b: (read_items(s["items_path"]), read_items(s["fewshot_path"]))
            for b, s in summaries.items()}


def test_subsets_are_stratified_proportionally(paper_items):
    for b, ((items, meta), _) in paper_items.items():
        assert len(items) == 300 == meta["n_items"]
        full = load_benchmark(b, DATA_DIR)
        full = full[full["split"] == EVAL_SPLIT[b]]
        sizes = Counter(full["stratum"])
        got = Counter(items["stratum"])
        assert set(got) == set(sizes), b  # every stratum represented
        for s, size in sizes.items():
            assert abs(got[s] - 300 * size / len(full)) < 1, (b, s, got[s])
        assert meta["strata"] == dict(sorted(got.items()))
    tox = Counter(paper_items["toxigen"][0][0]["label"])
    assert tox == {"toxic": 145, "benign": 155}  # 300 * 351/727 = 144.8
    xs = paper_items["xstest"][0][0]
    assert Counter(xs["label"]) == {"safe": 167, "unsafe": 133}
    assert (paper_items["toxigen"][0][0]["split"] == "test").all()


def test_fewshot_pools(paper_items):
    for b, ((items, meta), (pool, pmeta)) in paper_items.items():
        assert len(pool) == 5 and pool["item_id"].is_unique
        assert not set(pool["item_id"]) & set(items["item_id"]), b
        assert pmeta["subset_hash"] == meta["subset_hash"]
        assert pmeta["fewshot_ids"] == pool["item_id"].tolist() == meta["fewshot_ids"]
    tox = paper_items["toxigen"][1][0]
    assert (tox["split"] == "train").all()
    assert tox["item_id"].str.split("/").str[1].astype(int).min() >= 940
    assert tox["label"].tolist() == ["benign", "toxic", "benign", "toxic", "benign"]
    assert paper_items["xstest"][1][0]["label"].tolist() == ["safe", "unsafe"] * 2 + ["safe"]
    cond = [json.loads(m)["context_condition"] for m in paper_items["bbq"][1][0]["meta"]]
    assert cond == ["ambig", "disambig"] * 2 + ["ambig"]


def test_check_disjoint_raises():
    with pytest.raises(ItemsError, match="xstest: few-shot pool overlaps .*xstest/3"):
        check_disjoint(["xstest/1", "xstest/3"], ["xstest/3", "xstest/9"], "xstest")


def test_rebuild_is_identical(paper_build, tmp_path):
    cfg, first = paper_build
    for b in KNOWN_BENCHMARKS:
        again = build_items(cfg, b, out_dir=tmp_path)
        assert again["subset_hash"] == first[b]["subset_hash"]
        a, _ = read_items(first[b]["items_path"])
        c, _ = read_items(again["items_path"])
        assert a.equals(c)
        assert read_items(first[b]["fewshot_path"])[0].equals(read_items(again["fewshot_path"])[0])


def test_identical_across_processes_with_different_hash_seeds(paper_build, tmp_path):
    """No dependence on Python's salted hash() or set order: fresh interpreters with
    different PYTHONHASHSEED produce the same subsets."""
    cfg, first = paper_build
    code = ("import json,sys; from safetyrepro.config import load_config; "
            "from safetyrepro.items import build_items; cfg=load_config(sys.argv[1]); "
            "print(json.dumps({b: build_items(cfg, b, out_dir=sys.argv[2])['subset_hash'] "
            "for b in ('bbq','xstest','truthfulqa')}))")
    for hash_seed in ("1", "987"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed,
               "PYTHONPATH": str(PROJECT_ROOT / "src")}
        out = subprocess.run([sys.executable, "-c", code, cfg.path, str(tmp_path / hash_seed)],
                             env=env, capture_output=True, text=True, check=True)
        hashes = json.loads(out.stdout)
        assert hashes == {b: first[b]["subset_hash"] for b in hashes}
        a = read_items(first["truthfulqa"]["items_path"])[0]
        b = read_items(tmp_path / hash_seed / "truthfulqa.parquet")[0]
        assert a.equals(b)  # same ids and same shuffled choices


def test_seed_changes_subset(tmp_path, paper_build):
    _, first = paper_build
    cfg = config(tmp_path, PAPER, data={"items_seed": 7})
    other = build_items(cfg, "bbq")
    assert other["subset_hash"] != first["bbq"]["subset_hash"]
    for s, k in first["bbq"]["strata"].items():  # same allocation up to seeded tie-breaks
        assert abs(other["strata"][s] - k) <= 1
    a = set(read_items(other["items_path"])[0]["item_id"])
    b = set(read_items(first["bbq"]["items_path"])[0]["item_id"])
    assert len(a & b) < 60


def test_subset_hash_covers_source_content(tmp_path):
    """A changed source file changes the subset hash even when the ids stay the same."""
    data = tmp_path / "data"
    (data / "xstest").mkdir(parents=True)
    text = (DATA_DIR / "xstest/xstest_prompts.csv").read_text(encoding="utf-8")
    (data / "xstest/xstest_prompts.csv").write_text(text, encoding="utf-8")
    cfg = config(tmp_path, {"xstest": {"n_items": 20}}, data={"local_dir": str(data)})
    before = build_items(cfg, "xstest", out_dir=tmp_path / "a")
    ref = build_items(config(tmp_path, {"xstest": {"n_items": 20}}, name="d.yaml"), "xstest",
                      out_dir=tmp_path / "ref")
    assert before["subset_hash"] == ref["subset_hash"]  # hash uses paths relative to data dir
    (data / "xstest/xstest_prompts.csv").write_text(text.replace("Python", "Perl", 1),
                                                    encoding="utf-8")
    after = build_items(cfg, "xstest", out_dir=tmp_path / "b")
    assert read_items(after["items_path"])[0]["item_id"].tolist() == \
        read_items(before["items_path"])[0]["item_id"].tolist()
    assert after["subset_hash"] != before["subset_hash"]
