"""The Python API: ``safetyrepro.certify`` on a DataFrame gives the CLI's numbers for the same
table as a CSV, ``import safetyrepro`` stays cheap, and ``read_helm`` reads real HELM runs.
``read_lmeval`` on real lm-eval runs is tested in tests/crosspkg/test_crosspkg_import.py, beside
the other tests of the same session fixture."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import run_cli


def _item_table() -> pd.DataFrame:
    """Item-level 0/1 scores of two models on one benchmark, four configs on two axes."""
    rng = np.random.default_rng(5)
    rows = []
    for template in ("T1", "T2"):
        for shots in ("k0", "k3"):
            for model, p in (("A", 0.6 if template == "T1" else 0.4), ("B", 0.5)):
                for i in range(30):
                    rows.append({"model": model, "benchmark": "bbq", "template": template, "shots": shots,
                                 "item": f"q{i}", "score": float(rng.random() < p)})
    return pd.DataFrame(rows)


def test_certify_dataframe_matches_cli_json(tmp_path):
    import safetyrepro
    from safetyrepro.certify import CertifyResult, to_json

    df = _item_table()
    res = safetyrepro.certify(df, config_cols="template,shots", alpha=0.1, samples=200, seed=3, nominal="T1-k0")
    assert isinstance(res, CertifyResult) and res.level == "item" and res.source == "<DataFrame>"
    assert isinstance(res.pairs, pd.DataFrame) and isinstance(res.summary, pd.DataFrame)
    assert isinstance(res.reversal, pd.DataFrame) and len(res.reversal) == 1
    assert {"significance", "significance_configs"} <= set(res.significance)
    csv = tmp_path / "scores.csv"
    df.to_csv(csv, index=False)
    r = run_cli("certify", str(csv), "--json", "--config-cols", "template,shots", "--alpha", "0.1",
                "--bootstrap-samples", "200", "--bootstrap-seed", "3", "--nominal", "T1-k0")
    assert r.returncode == 0, r.stderr
    cli, api = json.loads(r.stdout), json.loads(to_json(res))
    assert cli.pop("source") == str(csv) and api.pop("source") == "<DataFrame>"
    assert api == cli
    # list form of config_cols, and the input frame is left as it was
    before = df.copy()
    again = safetyrepro.certify(df, config_cols=["template", "shots"], alpha=0.1, samples=200, seed=3,
                                nominal="T1-k0")
    pd.testing.assert_frame_equal(again.pairs, res.pairs)
    pd.testing.assert_frame_equal(df, before)


def test_certify_module_is_the_call():
    """``import safetyrepro.certify`` binds the module on the package; it is the call too."""
    import safetyrepro.certify

    import safetyrepro

    df = pd.DataFrame({"model": ["A", "B"], "benchmark": ["b", "b"], "config": ["c", "c"], "score": [0.9, 0.1]})
    assert safetyrepro.certify(df).pairs.iloc[0]["d1"]
    assert safetyrepro.certify.CertifyResult is safetyrepro.CertifyResult


def test_certify_dataframe_errors_name_rows():
    import safetyrepro
    from safetyrepro.errors import DataError

    df = pd.DataFrame({"model": ["A", "B", "A"], "benchmark": ["b"] * 3, "config": ["c", "c", "d"],
                       "score": [0.5, "x", 0.2]}, index=[10, 11, 12])
    with pytest.raises(DataError, match=r"<DataFrame>: non-numeric.*row\(s\) \[1\].*'x'"):
        safetyrepro.certify(df)
    with pytest.raises(DataError, match=r"<DataFrame>: missing column\(s\) \['config'\]"):
        safetyrepro.certify(df.drop(columns="config"))
    with pytest.raises(DataError, match="expected a pandas DataFrame or a file path, got list"):
        from safetyrepro.certify import validate_score_table

        validate_score_table([1, 2], "<DataFrame>")


def test_import_safetyrepro_is_cheap():
    code = ("import sys, safetyrepro; heavy = [m for m in ('pandas', 'numpy', 'torch', 'typer') "
            "if m in sys.modules]; print(heavy, sorted(safetyrepro.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("[] ")
    assert "'certify'" in out and "'read_lmeval'" in out and "'read_helm'" in out


def test_read_helm_matches_the_cli_import(tmp_path):
    """read_helm on the real HELM run folders gives the table `safetyrepro import helm` writes."""
    import safetyrepro

    suite = Path(__file__).parent / "data" / "helm" / "runs" / "sr"
    runs = [suite / "simple_mcqa:model=local_smollm2-135m", suite / "simple_mcqa:model=local_smollm2-135m,max_train_instances=0"]
    df = safetyrepro.read_helm(runs)
    out = tmp_path / "helm.parquet"
    r = run_cli("import", "helm", *map(str, runs), "--out", str(out))
    assert r.returncode == 0, r.stderr
    cli = pd.read_parquet(out)
    assert len(df) == len(cli) > 0 and set(df["model"]) == set(cli["model"])
    cols = ["model", "benchmark", "config", "item", "score"]
    pd.testing.assert_frame_equal(df[cols].sort_values(cols).reset_index(drop=True),
                                  cli[cols].sort_values(cols).reset_index(drop=True))
    assert df.attrs["axes"] and df["config"].nunique() == 2       # the shots differ between the runs
