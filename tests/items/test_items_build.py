"""build_items / read_items / the `items` CLI command on the real files."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from typer.testing import CliRunner

from items_support import DATA_DIR, cli_app, config, write_config
from safetyrepro.hashing import sha256_file
from safetyrepro.items import build_items, item_meta, read_items
from safetyrepro.items.schema import arrow_schema
from safetyrepro.items.subsets import subset_hash
from safetyrepro.provenance import code_version


def test_build_writes_items_fewshot_and_metadata(tmp_path):
    cfg = config(tmp_path, {"bbq": {"n_items": 24, "categories": ["Religion", "Age"]}})
    s = build_items(cfg, "bbq")
    assert s["items_path"] == cfg.results_dir / "items" / "bbq.parquet"
    assert s["fewshot_path"] == cfg.results_dir / "items" / "bbq.fewshot.parquet"
    assert pq.read_schema(s["items_path"]).remove_metadata() == arrow_schema("bbq")
    items, meta = read_items(s["items_path"])
    pool, pmeta = read_items(s["fewshot_path"])
    assert len(items) == 24 and len(pool) == 5
    # proportional: 24 * 3680 / 4880 = 18.1 Age, 5.9 Religion; split evenly by condition
    assert s["strata"] == {"Age/ambig": 9, "Age/disambig": 9, "Religion/ambig": 3,
                           "Religion/disambig": 3}
    assert meta["kind"] == "items" and pmeta["kind"] == "fewshot"
    assert meta["benchmark"] == "bbq" and meta["n_items"] == 24
    assert meta["items_seed"] == cfg.data["data"]["items_seed"]
    assert meta["config_hash"] == cfg.hash and meta["code_version"] == code_version()
    assert meta["categories"] == ["Age", "Religion"]
    assert meta["sources"] == [
        {"path": f"bbq/data/{c}.jsonl", "sha256": sha256_file(DATA_DIR / f"bbq/data/{c}.jsonl")}
        for c in ("Religion", "Age")]
    assert meta["subset_hash"] == s["subset_hash"] == subset_hash(
        "bbq", items["item_id"], meta["sources"], meta["items_seed"])
    assert isinstance(items["choices"][0], list) and isinstance(items["meta"][0], str)
    assert set(item_meta(items.iloc[0])) >= {"category", "context_condition",
                                             "question_polarity", "unknown_index",
                                             "target_index"}


def test_crows_pairs_parquet_has_sentence_columns(tmp_path):
    cfg = config(tmp_path, {"crows_pairs": {"n_items": 30}})
    items, _ = read_items(build_items(cfg, "crows_pairs", out_dir=tmp_path / "o")["items_path"])
    assert {"sent_more", "sent_less"} <= set(items.columns)
    for r in items.itertuples():
        assert item_meta(r)["sent_more"] == r.sent_more


def test_cli_builds_one_or_all(tmp_path):
    cfg_path = write_config(tmp_path, {"xstest": {"n_items": 20}, "toxigen": {"n_items": 10}})
    runner = CliRunner()
    res = runner.invoke(cli_app(), ["items", "--config", str(cfg_path), "--benchmark", "xstest",
                                    "--out-dir", str(tmp_path / "one")])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == [
        "xstest.fewshot.parquet", "xstest.parquet"]
    _, meta = read_items(tmp_path / "one" / "xstest.parquet")
    assert f"subset_hash {meta['subset_hash']}" in res.output
    assert "safe/homonyms" in res.output and "unsafe/contrast_homonyms" in res.output
    res = runner.invoke(cli_app(), ["items", "--config", str(cfg_path)])
    assert res.exit_code == 0, res.output
    out = tmp_path / "results" / "items"
    assert sorted(p.name for p in out.iterdir()) == [
        "toxigen.fewshot.parquet", "toxigen.parquet", "xstest.fewshot.parquet", "xstest.parquet"]
    tox, tmeta = read_items(out / "toxigen.parquet")
    assert "toxic " in res.output and "benign " in res.output
    assert json.dumps(tmeta["strata"]) == json.dumps({"benign": 5, "toxic": 5})
    assert read_items(out / "xstest.parquet")[1]["subset_hash"] == meta["subset_hash"]
