"""The whole workflow on the fake backend (models with ``source: {kind: fake}``): every rule,
through the real Snakemake, model workers and cell client, without loading a model. Proves the
rules' glue (declared inputs, decode groups, the bf16 variant, aggregation, analyses, report)
in about a minute; the real-model runs (test_workflow.py) prove the numerics."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from safetyrepro.config import load_config
from safetyrepro.errors import ConfigError
from workflow_support import make_project_copy, planned, snakemake

pytestmark = pytest.mark.slow   # a whole Snakemake run (~45 s): in `make test`, not the edit loop's tier

FAKE_MODELS = {"fake-a": {"display_name": "fake A", "quantization": "nf4", "source": {"kind": "fake"}},
               "fake-b": {"display_name": "fake B", "quantization": "bf16", "source": {"kind": "fake"}}}


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    project, config = make_project_copy(tmp_path_factory.mktemp("fake"), {"models": FAKE_MODELS})
    r = snakemake(project, config, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return project, config, r


def test_every_rule_runs_on_the_fake_backend(fake_run):
    project, config, r = fake_run
    res = project / "results"
    shards = sorted((res / "shards").rglob("*.parquet"))
    assert len(shards) == 64   # 2 models x 2 benchmarks x the tiny envelope's 32 cells
    infos = [json.loads(pq.read_schema(p).metadata[b"safetyrepro"])["model_info"] for p in shards]
    assert {i["backend"] for i in infos} == {"fake"}
    # the precision check's bf16 cells ran for every model, in bf16
    bf16 = list((res / "shards_bf16").rglob("*.parquet"))
    assert {p.parts[-4] for p in bf16} == set(FAKE_MODELS)
    assert {json.loads(pq.read_schema(p).metadata[b"safetyrepro"])["model_info"]["quantization"] for p in bf16} == {"bf16"}
    cells = pq.read_table(res / "tables" / "cell_scores.parquet").to_pandas()
    assert len(cells) == 48 and set(cells["model"]) == set(FAKE_MODELS)
    assert cells["score"].between(0, 1).all()
    for f in ("report.md", "cards/index.json", "tables/rho_flip.parquet", "tables/significance.parquet",
              "figures/rho_heatmap.png", "tables/anova.parquet", "tables/precision.parquet"):
        assert (res / f).exists(), f
    # nothing was loaded: the workers' load events name no model folder
    marker = json.loads((res / "models" / "fake-a.json").read_text())
    assert marker["fake-a"]["path"] is None and marker["fake-a"]["chat_template_hash"] is None
    assert planned(project, config)[0] == {}     # a second run has nothing to do


def test_fake_outputs_are_deterministic_and_differ_between_models(fake_run):
    project, _, _ = fake_run
    res = project / "results" / "shards"
    a = pq.read_table(res / "fake-a" / "xstest" / "T1-greedy-k0-freeform" / "s0.parquet").to_pandas()
    b = pq.read_table(res / "fake-b" / "xstest" / "T1-greedy-k0-freeform" / "s0.parquet").to_pandas()
    assert list(a["item_id"]) == list(b["item_id"])
    assert list(a["prompt"]) == list(b["prompt"])
    # each fake model answers from its key and the prompt: same prompts, other answers
    assert list(a["raw_output"]) != list(b["raw_output"])
    t07 = pq.read_table(res / "fake-a" / "xstest" / "T1-t0.7-k0-freeform" / "s1.parquet").to_pandas()
    assert list(t07["raw_output"]) != list(a["raw_output"])   # sampled streams differ


def test_a_fake_model_cannot_feed_the_cross_package_stage(tmp_path):
    analysis = {"bootstrap_samples": 50, "subsample_repeats": 3, "precision_check": True, "cross_package": True}
    _, config = make_project_copy(tmp_path, {"models": FAKE_MODELS, "analysis": analysis})
    with pytest.raises(ConfigError, match="analysis.cross_package"):
        load_config(config)
