"""Benchmark 25 (benchmarks/bench_packed_linear.py) runs for real on the embedded SmolLM2: every
linear-layer shape is timed both ways, a decode group runs on the model loaded plain and packed,
and the record says which path each side used. Where this CPU does not pack (no native bf16),
the script says so and exits 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from safetyrepro.models.packed_linear import available, resolve

from conftest import ROOT, run_cli
from workflow_support import smol_truthfulqa_config


@pytest.mark.slow
def test_bench_packed_linear_small_run(tmp_path):
    _, path = smol_truthfulqa_config(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["benchmarks"] = {"truthfulqa": {"n_items": 4}}
    path.write_text(yaml.safe_dump(raw))
    r = run_cli("items", "--config", str(path))
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_packed_linear.py"), "--config", str(path),
                        "--models", "smollm2-135m", "--rows", "1", "5", "--reps", "2", "--rounds", "1",
                        "--cases", "smollm2-135m:truthfulqa:T1:k0", "--out", str(out)],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    if resolve("packed", "cpu", "bfloat16") != "packed" or not available():
        assert r.returncode == 2 and "does not pack bf16 linear layers" in r.stderr, r.stderr[-3000:]
        assert not (out / "packed_linear.json").exists()
        return
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads((out / "packed_linear.json").read_text())
    products = rec["products"]
    # SmolLM2's distinct shapes: q/o (576x576), k/v (576x192), gate/up (576x1536), down, the vocabulary
    shapes = {(p["in"], p["out"]) for p in products}
    assert {(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152)} <= shapes
    assert {p["rows"] for p in products} == {1, 5} and len(products) == 2 * len(shapes)
    assert all(p["ratio"] > 0 and len(p["times_s"]["plain"]) == 1 for p in products)
    (group,) = rec["records"]
    assert group["n_sequences"] == 4 * 11 and 0 <= group["identical_sequences"] <= 44
    assert group["model_info"]["linear"] == "packed"
    assert rec["machine"]["cpu"] and "speed-up" in rec["table"] and "F.linear ms" in rec["products_table"]
