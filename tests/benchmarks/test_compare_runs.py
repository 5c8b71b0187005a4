"""benchmarks/compare_runs.py on two small results folders: it finds exactly the shard rows and
table cells that differ, and counts nothing that does not."""

from __future__ import annotations

import importlib.util

import pandas as pd

from workflow_support import ROOT

spec = importlib.util.spec_from_file_location("compare_runs", ROOT / "benchmarks" / "compare_runs.py")
compare_runs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_runs)


def _shard(raw: list[str], ll=None) -> pd.DataFrame:
    n = len(raw)
    return pd.DataFrame({"item_id": [f"i{k}" for k in range(n)], "prompt": ["p"] * n, "raw_output": raw,
                         "cand_logliks": ll or [None] * n, "parsed_label": ["A"] * n, "parse_ok": [True] * n,
                         "correct": [True] * n, "n_gen_tokens": [3] * n})


def _write(root, rel, df):
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(p)


def test_compare_runs_finds_exactly_what_differs(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    greedy, sampled = "shards/m/bbq/T1-greedy-k0-freeform/s0.parquet", "shards/m/bbq/T1-t0.3-k0-freeform/s2.parquet"
    lp = "shards_bf16/m/xstest/T1-greedy-k0-logprob/s0.parquet"
    for root in (old, new):
        _write(root, greedy, _shard(["x", "y", "z"]))
        _write(root, "tables/cell_scores.parquet", pd.DataFrame({"benchmark": ["bbq", "xstest"], "score": [0.5, 1 / 3]}))
    _write(old, sampled, _shard(["a", "b"]))
    s = _shard(["a", "c"])
    s.loc[1, "parsed_label"] = "B"
    _write(new, sampled, s)
    _write(old, lp, _shard(["", ""], ll=[[-1.0, -2.0], [-0.5, -0.25]]))
    _write(new, lp, _shard(["", ""], ll=[[-1.0, -2.0], [-0.5, -0.25000000000000006]]))
    _write(new, "shards/m/bbq/T2-greedy-k0-freeform/s0.parquet", _shard(["q"]))
    _write(new, "tables/rho_flip.parquet", pd.DataFrame({"x": [1]}))
    _write(old, "tables/table2.parquet", pd.DataFrame({"benchmark": ["bbq", "xstest"], "rho": [0.1, 0.2]}))
    _write(new, "tables/table2.parquet", pd.DataFrame({"benchmark": ["bbq", "xstest"], "rho": [0.1, 0.25]}))

    sh = compare_runs.compare_shards(old, new)
    assert sh["shards_compared"] == 3 and sh["shards_raw_identical"] == 1
    assert sh["only_new"] == ["shards/m/bbq/T2-greedy-k0-freeform/s0.parquet"] and sh["only_old"] == []
    diffs = {d["shard"]: d for d in sh["raw_differences"]}
    assert diffs[sampled]["columns"] == {"raw_output": 1} and diffs[sampled]["first_item"] == "i1"
    assert diffs[lp]["columns"] == {"cand_logliks": 1}  # floats compared exactly (one ulp apart)
    assert [d["shard"] for d in sh["write_time_parse_differences"]] == [sampled]
    kinds = {(r["variant_root"], r["kind"]): r for r in sh["per_benchmark_kind"]}
    assert kinds[("shards", "greedy free-form")].get("raw_differs", 0) == 0
    assert kinds[("shards", "sampled free-form")]["raw_differs"] == 1
    assert kinds[("shards_bf16", "logprob")]["rows"] == 2

    tb = {t["table"]: t for t in compare_runs.compare_tables(old, new)["tables"]}
    assert tb["cell_scores.parquet"]["identical"] is True
    assert tb["table2.parquet"]["identical"] is False
    assert tb["table2.parquet"]["differing_rows_per_column"] == {"rho": 1}
    assert tb["table2.parquet"]["differing_rows_per_benchmark"] == {"xstest": 1}
    assert compare_runs.compare_tables(old, new)["only_new"] == ["rho_flip.parquet"]
