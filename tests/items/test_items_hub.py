"""The hub path: hub-format files (written here, in each hub dataset's column layout) are
loaded with `datasets` and normalised by the same functions `data.source: hub` uses, giving
the same canonical schema (and, where the content is the same, the same items) as the local
files."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import datasets
import pandas as pd
import pytest
from datasets import ClassLabel, Dataset, Features, Sequence, Value

from items_support import DATA_DIR
from safetyrepro.errors import DataError
from safetyrepro.items import load_benchmark
from safetyrepro.items import hub
from safetyrepro.items.schema import arrow_schema, make_frame, to_arrow
from safetyrepro.paths import PROJECT_ROOT

SEED = 20240601


def _load(tmp_path, ds: Dataset, fmt: str, name: str):
    """Write ``ds`` as a local parquet/jsonl file and load it back through `datasets`."""
    path = tmp_path / f"{name}.{fmt}"
    (ds.to_parquet if fmt == "parquet" else ds.to_json)(str(path))
    return datasets.load_dataset("parquet" if fmt == "parquet" else "json",
                                 data_files=str(path), split="train",
                                 cache_dir=str(tmp_path / "hf-cache"))


def _same(local: pd.DataFrame, records: list[dict], benchmark: str) -> None:
    got = make_frame(records, benchmark)
    local = local.reset_index(drop=True).copy()
    local.attrs = {}
    assert to_arrow(got, benchmark).schema == arrow_schema(benchmark)
    pd.testing.assert_frame_equal(got, local)


def test_truthfulqa_hub_layout(tmp_path):
    raw = json.loads((DATA_DIR / "truthfulqa/v0/mc_task.json").read_text())
    rows = [{"question": r["question"],
             "mc1_targets": {"choices": list(r["mc1_targets"]),
                             "labels": list(r["mc1_targets"].values())},
             "mc2_targets": {"choices": list(r["mc2_targets"]),
                             "labels": list(r["mc2_targets"].values())}} for r in raw]
    ds = _load(tmp_path, Dataset.from_list(rows), "parquet", "tqa")
    assert ds.features["mc1_targets"]["choices"] == datasets.List(Value("string"))
    _same(load_benchmark("truthfulqa", DATA_DIR, items_seed=SEED),
          hub.normalize_truthfulqa_hub(ds, items_seed=SEED), "truthfulqa")


def test_bbq_hub_layout(tmp_path):
    rows = [json.loads(x) for x in
            (DATA_DIR / "bbq/data/Religion.jsonl").read_text().splitlines()]
    ds = _load(tmp_path, Dataset.from_list(rows), "jsonl", "bbq")
    _same(load_benchmark("bbq", DATA_DIR, categories=["Religion"]),
          hub.normalize_bbq_hub(ds, category="Religion"), "bbq")


def test_crows_pairs_hub_layout_with_classlabels(tmp_path):
    with open(DATA_DIR / "crows_pairs/crows_pairs_anonymized.csv", encoding="utf-8-sig",
              newline="") as fh:
        raw = list(csv.DictReader(fh))
    bias_names = ["race-color", "socioeconomic", "gender", "disability", "nationality",
                  "sexual-orientation", "physical-appearance", "religion", "age"]
    directions = ["stereo", "antistereo"]
    features = Features({"id": Value("int32"), "sent_more": Value("string"),
                         "sent_less": Value("string"),
                         "stereo_antistereo": ClassLabel(names=directions),
                         "bias_type": ClassLabel(names=bias_names),
                         "anon_writer": Value("string"),
                         "anon_annotators": Sequence(Value("string"))})
    ds = Dataset.from_dict({
        "id": [int(r[""]) for r in raw], "sent_more": [r["sent_more"] for r in raw],
        "sent_less": [r["sent_less"] for r in raw],
        "stereo_antistereo": [directions.index(r["stereo_antistereo"]) for r in raw],
        "bias_type": [bias_names.index(r["bias_type"]) for r in raw],
        "anon_writer": [r["anon_writer"] for r in raw],
        "anon_annotators": [[] for _ in raw]}, features=features)
    ds = _load(tmp_path, ds, "parquet", "crows")
    assert isinstance(ds.features["bias_type"], ClassLabel) and ds[0]["bias_type"] == 0
    _same(load_benchmark("crows_pairs", DATA_DIR), hub.normalize_crows_pairs_hub(ds),
          "crows_pairs")


def test_xstest_hub_layout_without_id(tmp_path):
    local = pd.read_csv(DATA_DIR / "xstest/xstest_prompts.csv", encoding="utf-8-sig",
                        keep_default_na=False)
    rows = [{"prompt": r.prompt, "focus": r.focus or None, "type": r.type,
             "note": r.note or None, "label": r.label} for r in local.itertuples()]
    ds = _load(tmp_path, Dataset.from_list(rows), "parquet", "xstest")
    assert "id" not in ds.column_names
    _same(load_benchmark("xstest", DATA_DIR), hub.normalize_xstest_hub(ds), "xstest")


def _toxigen_hub_rows(n: int, start: int) -> list[dict]:
    raw = json.loads((DATA_DIR / "toxigen/safenlp/toxiGen.json").read_text())[start:start + n]
    return [{"text": r["text"], "target_group": r["target_groups"][0], "factual?": "neither",
             "ingroup_effect": "doesn't use in-group language", "lewd": "no",
             "framing": "disagreement", "predicted_group": "the text directly references",
             "stereotyping": "doesn't use positive stereotyping", "intent": 1.0,
             "toxicity_ai": 5.0 - r["toxicity_score"] if i % 2 else r["toxicity_score"],
             "toxicity_human": r["toxicity_score"], "predicted_author": "human",
             "actual_method": "topk"} for i, r in enumerate(raw)]


def test_toxigen_hub_layout_labels_and_ids(tmp_path):
    rows = _toxigen_hub_rows(8, 0)
    ds = _load(tmp_path, Dataset.from_list(rows), "parquet", "tox-test")
    test = make_frame(hub.normalize_toxigen_hub(ds, split="test"), "toxigen")
    assert to_arrow(test, "toxigen").schema == arrow_schema("toxigen")
    assert test["item_id"].tolist() == [f"toxigen/{i}" for i in range(8)]
    assert (test["split"] == "test").all()
    for r, src in zip(test.itertuples(), rows):
        total = src["toxicity_ai"] + src["toxicity_human"]
        assert r.label == ("toxic" if total > 5.5 else "benign") == r.stratum
        meta = json.loads(r.meta)
        assert meta["target_groups"] == [src["target_group"]]
        assert meta["toxicity_score"] == src["toxicity_human"]
        assert meta["toxicity_ai"] == src["toxicity_ai"]
    assert set(test["label"]) == {"toxic", "benign"}
    train = make_frame(hub.normalize_toxigen_hub(ds, split="train"), "toxigen")
    assert train["item_id"].tolist() == [f"toxigen/{940 + i}" for i in range(8)]
    assert (train["split"] == "train").all()
    bad = Dataset.from_list([{**rows[0], "toxicity_ai": None}])
    with pytest.raises(DataError, match=r"hub:toxigen/toxigen-data/annotated:test, row 1: "
                                        r"toxicity_ai"):
        hub.normalize_toxigen_hub(bad, split="test")


def test_load_hub_assembles_splits_and_sources(tmp_path):
    """The full hub path (split list, id offsets, source hashes), fetching each HubSplit
    from a local hub-format parquet instead of the network."""
    files = {"test": _toxigen_hub_rows(30, 0), "train": _toxigen_hub_rows(40, 700)}
    loaded = {split: _load(tmp_path, Dataset.from_list(rows), "parquet", f"tox-{split}")
              for split, rows in files.items()}
    seen = []

    def fetch(spec: hub.HubSplit):
        seen.append(spec)
        assert (spec.repo, spec.config) == ("toxigen/toxigen-data", "annotated")
        return loaded[spec.split]

    records, sources = hub.load_hub("toxigen", items_seed=SEED, fetch=fetch)
    assert [s.split for s in seen] == ["test", "train"]
    df = make_frame(records, "toxigen")
    assert df["split"].value_counts().to_dict() == {"train": 40, "test": 30}
    assert [s["path"] for s in sources] == ["hub:toxigen/toxigen-data/annotated:test",
                                            "hub:toxigen/toxigen-data/annotated:train"]
    again, sources2 = hub.load_hub("toxigen", items_seed=SEED, fetch=lambda s: loaded[s.split])
    assert sources2 == sources and all(len(s["sha256"]) == 64 for s in sources)


def test_hub_splits_for_every_benchmark():
    assert hub.hub_splits("truthfulqa") == [hub.HubSplit("truthful_qa", "multiple_choice",
                                                         "validation")]
    assert [s.config for s in hub.hub_splits("bbq")] == [
        "Age", "Disability_status", "Nationality", "Physical_appearance", "Religion",
        "Sexual_orientation"]
    assert [s.config for s in hub.hub_splits("bbq", ["SES"])] == ["SES"]  # all 11 on the hub
    assert hub.hub_splits("crows_pairs")[0].where == "hub:nyu-mll/crows_pairs:test"
    assert hub.hub_splits("xstest")[0].where == "hub:walledai/XSTest:test"


def test_unreachable_hub_is_a_clear_error(tmp_path):
    code = ("from safetyrepro.items import load_benchmark\n"
            "from safetyrepro.errors import DataError\n"
            "try:\n    load_benchmark('xstest', '.', source='hub')\n"
            "except DataError as e:\n    print(e)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(PROJECT_ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.startswith("hub:walledai/XSTest:test: could not load from the Hugging "
                                 "Face hub"), out.stdout + out.stderr
    assert "data.source: local" in out.stdout
