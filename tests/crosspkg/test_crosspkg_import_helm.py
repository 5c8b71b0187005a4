"""`safetyrepro import helm` on real HELM run folders (tests/data/helm: written by helm-run of
crfm-helm 0.5.16 on the embedded SmolLM2-135M; README there), and on broken copies of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from conftest import run_cli

SUITE = Path(__file__).parents[1] / "data" / "helm" / "runs" / "sr"
PLAIN = SUITE / "simple_mcqa:model=local_smollm2-135m"
ZERO = SUITE / "simple_mcqa:model=local_smollm2-135m,max_train_instances=0"
LOWER = SUITE / "simple_mcqa:model=local_smollm2-135m,data_augmentation=lower"


def _want(run: Path) -> dict:
    """exact_match by hand from HELM's scenario state: the completion, stripped, is the letter
    that HELM's output mapping gives the correct reference."""
    state = json.loads((run / "scenario_state.json").read_text())
    out = {}
    for rs in state["request_states"]:
        inst = rs["instance"]
        (gold,) = [r["output"]["text"] for r in inst["references"] if "correct" in r["tags"]]
        letter = {v: k for k, v in rs["output_mapping"].items()}[gold]
        item = inst["id"] + (f"~{inst['perturbation']['name']}" if inst.get("perturbation") else "")
        out[item] = 1.0 if rs["result"]["completions"][0]["text"].strip() == letter else 0.0
    return out


def test_helm_import_round_trip(tmp_path):
    from safetyrepro.crosspkg.importers import import_helm

    res = import_helm([PLAIN, ZERO])
    t = res.table
    assert res.axes == ["shots"] and sorted(t["config"].unique()) == ["0", "5"]
    assert res.constant["method"] == "multiple_choice_joint" and res.constant["metric"] == "exact_match"
    assert res.constant["temperature"] == "0.0" and res.constant["max_tokens"] == "5"
    assert set(t["model"]) == {"smollm2-135m"} and set(t["benchmark"]) == {"simple_mcqa"}
    for run, shots in ((PLAIN, "5"), (ZERO, "0")):
        cell = t[t["shots"] == shots].set_index("item")["score"]
        assert cell.to_dict() == _want(run)
    # the per-instance stat read is HELM's own: its mean for the instance
    per = json.loads((PLAIN / "per_instance_stats.json").read_text())
    q = import_helm([PLAIN], metric="num_prompt_tokens").table.set_index("item")["score"]
    for e in per:
        (st,) = [s for s in e["stats"] if s["name"]["name"] == "num_prompt_tokens"]
        assert q[e["instance_id"]] == st["mean"]
    # a perturbation is part of the item id
    items = sorted(import_helm([LOWER]).table["item"])
    assert items == sorted([*_want(PLAIN), *(f"{i}~lowercase" for i in _want(PLAIN))])
    # the CLI, with a suite folder: the perturbed run scores other items than the plain ones
    p = run_cli("import", "helm", str(SUITE), "--out", str(tmp_path / "x.csv"))
    assert p.returncode == 2 and "different item sets" in p.stderr and "~lowercase" in p.stderr
    p = run_cli("import", "helm", str(PLAIN), str(ZERO), "--out", str(tmp_path / "h.parquet"), "--json")
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["n_runs"] == 2 and info["n_rows"] == 6 and info["axes"] == ["shots"]
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "h.parquet"), t)


def test_helm_metric_errors():
    from safetyrepro.crosspkg.importers import import_helm
    from safetyrepro.errors import DataError

    with pytest.raises(DataError, match=r"unknown metric 'acc'; every instance carries \[.*'exact_match'"):
        import_helm([PLAIN], metric="acc")
    with pytest.raises(DataError, match="not found"):
        import_helm([SUITE / "nope"])
    with pytest.raises(DataError, match="no HELM run folders"):
        import_helm([SUITE.parent.parent / "prod_env"])


def _copy(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(PLAIN, d)
    return d


def _edit(f: Path, fn):
    f.write_text(json.dumps(fn(json.loads(f.read_text()))))


def _huge_mean(v):
    for st in v[0]["stats"]:
        if st["name"]["name"] == "exact_match":
            st["mean"] = 10**400
    return v


BROKEN = {
    "no per_instance_stats.json": ("run", lambda d: (d / "per_instance_stats.json").unlink()),
    "run_spec.json is binary": ("run_spec.json", lambda d: (d / "run_spec.json").write_bytes(b"\xff\xfe\x00\x01")),
    "run_spec.json is a list": ("run_spec.json", lambda d: _edit(d / "run_spec.json", lambda v: [v])),
    "adapter_spec is text": ("run_spec.json", lambda d: _edit(d / "run_spec.json",
                                                              lambda v: {**v, "adapter_spec": "x"})),
    "shots is a list": ("run_spec.json", lambda d: _edit(d / "run_spec.json", lambda v: {
        **v, "adapter_spec": {**v["adapter_spec"], "max_train_instances": [5]}})),
    "a stats entry is a number": ("per_instance_stats.json", lambda d: _edit(
        d / "per_instance_stats.json", lambda v: [3, *v[1:]])),
    "a mean of 10**400": ("per_instance_stats.json", lambda d: _edit(d / "per_instance_stats.json", _huge_mean)),
    "an instance without stats": ("per_instance_stats.json", lambda d: _edit(
        d / "per_instance_stats.json", lambda v: v[1:])),
    "an instance twice": ("per_instance_stats.json", lambda d: _edit(
        d / "per_instance_stats.json", lambda v: [*v, v[0]])),
    "scenario_state.json is a folder": ("scenario_state.json", lambda d: (
        (d / "scenario_state.json").unlink(), (d / "scenario_state.json").mkdir())),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_helm_broken_run_folder_exits_2_naming_the_file(case, tmp_path):
    d = _copy(tmp_path)
    name, breaks = BROKEN[case]
    breaks(d)
    p = run_cli("import", "helm", str(d), "--out", str(tmp_path / "o.csv"))
    lines = p.stderr.strip().splitlines()
    target = d if name == "run" else d / name
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {target}"), p.stderr[-2000:]
    assert "Traceback" not in p.stderr and not (tmp_path / "o.csv").exists()


def test_helm_reader_never_raises_anything_but_data_error(tmp_path_factory):
    """Generated values anywhere in the three JSON files of a real run folder: the reader
    returns a table or raises DataError naming a file of the folder, nothing else."""
    import collections
    import tempfile

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from safetyrepro.crosspkg.importers import import_helm
    from safetyrepro.errors import DataError
    from test_crosspkg_import import _json_values, _mutate

    docs = {n: json.loads((PLAIN / n).read_text())
            for n in ("run_spec.json", "scenario_state.json", "per_instance_stats.json")}
    base = tmp_path_factory.mktemp("helmprop")
    seen = collections.Counter()

    @settings(max_examples=300, deadline=3000, suppress_health_check=list(HealthCheck), database=None)
    @given(which=st.sampled_from(sorted(docs)), path=st.lists(st.integers(0, 50), max_size=6),
           value=_json_values())
    def case(which, path, value):
        with tempfile.TemporaryDirectory(dir=base) as d:
            d = Path(d)
            for n, doc in docs.items():
                v = _mutate(doc, path, value) if n == which else doc
                try:
                    text = json.dumps(v)
                except ValueError:                # an int over Python's digit limit
                    text = str(v)
                (d / n).write_text(text)
            try:
                import_helm([d])
                seen["ok"] += 1
            except DataError as exc:
                assert str(d) in str(exc)
                seen["error"] += 1

    case()
    assert set(seen) == {"ok", "error"} and sum(seen.values()) >= 200, seen
