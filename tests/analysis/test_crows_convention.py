"""CrowS-Pairs under the parity-distance convention through the item-level analyses: the task
folder is a copy of the real one with only `scoring.convention` switched."""

import shutil

import pandas as pd
import pytest
import yaml

from analysis_synth import make_dataset
from safetyrepro.analysis.significance import write_significance
from safetyrepro.analysis.subsample import write_subsample_stability
from safetyrepro.io import read_metadata, write_parquet
from safetyrepro.paths import TASKS_DIR
from safetyrepro.tasks import loader, score_is_item_mean


@pytest.fixture
def parity_tasks(tmp_path, monkeypatch):
    d = tmp_path / "tasks"
    shutil.copytree(TASKS_DIR, d)
    content = yaml.safe_load((d / "crows_pairs.yaml").read_text())
    content["scoring"]["convention"] = "parity_distance"
    (d / "crows_pairs.yaml").write_text(yaml.safe_dump(content))
    monkeypatch.setattr(loader, "TASKS_DIR", d)
    loader.load_task.cache_clear()
    yield d
    loader.load_task.cache_clear()


def test_parity_convention_in_subsamples_and_significance(parity_tasks, tmp_path):
    assert not score_is_item_mean("crows_pairs") and score_is_item_mean("bbq")
    d = make_dataset(tmp_path / "data", n_items=20, seed=3, benchmarks=["bbq", "crows_pairs"])
    # CrowS rows as the scorer writes them: "more" (the stereotype preferred) exactly when not correct
    ir = pd.read_parquet(d["item_results"])
    crows_rows = ir["benchmark"] == "crows_pairs"
    ir.loc[crows_rows, "parsed_label"] = ir.loc[crows_rows, "correct"].map({True: "less", False: "more"})
    write_parquet(ir, d["item_results"], read_metadata(d["item_results"]))
    out = tmp_path / "out"
    paths = write_subsample_stability(d["item_results"], d["items_dir"], out, 0.8, 2, 0)
    cells = pd.read_parquet(paths["subsample_cells"])
    crows = cells[cells["benchmark"] == "crows_pairs"]
    # recomputed as the parity distance of the share of "more": with all items that is
    # (n - |2 n_more - n|) / n of the item rows, whatever the synthetic cell table says
    assert crows["score_all_items"].nunique() > 3  # not a degenerate all-one-side case
    for r in crows.itertuples():
        rows = ir[(ir["model"] == r.model) & (ir["benchmark"] == "crows_pairs") & (ir["config"] == r.config)]
        n, more = len(rows), int((rows["parsed_label"] == "more").sum())
        assert r.score_all_items == pytest.approx((n - abs(2 * more - n)) / n)
    sig = write_significance(d["cell_scores"], d["item_results"], out, samples=20)
    t = pd.read_parquet(sig["significance"])
    assert set(t["benchmark"]) == {"bbq"}  # no paired item test for a score that is not an item mean
    assert "crows_pairs" in read_metadata(sig["significance"])["params"]["skipped_benchmarks"]
