import json

import pandas as pd
import pytest

from conftest import run_cli


def _table(rows):
    return pd.DataFrame(rows, columns=["model", "benchmark", "config", "score"])


HAND = [
    # bbq: A vs B -> N+ = 2 (c1, c4), N- = 1 (c2), N0 = 1 (c3): rho = 1/4
    ("A", "bbq", "c1", 0.9), ("B", "bbq", "c1", 0.5),
    ("A", "bbq", "c2", 0.4), ("B", "bbq", "c2", 0.5),
    ("A", "bbq", "c3", 0.4), ("B", "bbq", "c3", 0.4),
    ("A", "bbq", "c4", 0.8), ("B", "bbq", "c4", 0.2),
    # xstest: A always ahead -> rho 0, D1 and D2
    ("A", "xstest", "c1", 0.9), ("B", "xstest", "c1", 0.1),
    ("A", "xstest", "c2", 0.8), ("B", "xstest", "c2", 0.2),
]


def test_certify_hand_table_json(tmp_path):
    p = tmp_path / "scores.csv"
    _table(HAND).to_csv(p, index=False)
    r = run_cli("certify", str(p), "--json", "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    pairs = {x["benchmark"]: x for x in j["pairs"]}
    assert (pairs["bbq"]["n_plus"], pairs["bbq"]["n_minus"], pairs["bbq"]["n_zero"]) == (2, 1, 1)
    assert pairs["bbq"]["rho_flip"] == pytest.approx(0.25) and pairs["bbq"]["ceiling"] == 0.5
    assert pairs["xstest"]["rho_flip"] == 0 and pairs["xstest"]["d1"] and pairs["xstest"]["d2"]
    bench = {x["benchmark"]: x for x in j["benchmarks"]}
    assert bench["bbq"]["orderings_reachable"] == 2 and bench["bbq"]["orderings_possible"] == 2
    assert (tmp_path / "out" / "pairs.csv").exists() and (tmp_path / "out" / "certify.json").exists()


def test_certify_text_and_parquet(tmp_path):
    p = tmp_path / "scores.parquet"
    _table(HAND).to_parquet(p)
    r = run_cli("certify", str(p))
    assert r.returncode == 0, r.stderr
    assert "rho_flip" in r.stdout and "0.250" in r.stdout and "2 of 2" in r.stdout


def test_certify_config_cols(tmp_path):
    rows = []
    for t in ("T1", "T2"):
        for k in ("k0", "k3"):
            rows.append(dict(model="A", benchmark="bbq", template=t, shots=k, score=0.5 + (t == "T1") * 0.1))
            rows.append(dict(model="B", benchmark="bbq", template=t, shots=k, score=0.55))
    p = tmp_path / "axes.csv"
    pd.DataFrame(rows).to_csv(p, index=False)
    r = run_cli("certify", str(p), "--json", "--config-cols", "template,shots")
    assert r.returncode == 0, r.stderr
    pair = json.loads(r.stdout)["pairs"][0]
    assert (pair["n_plus"], pair["n_minus"], pair["n_configs"]) == (2, 2, 4)
    assert pair["saturated"]


@pytest.mark.parametrize("rows, cols, needle", [
    ([("A", "bbq", "c1", 0.5)], ["model", "benchmark", "cfg", "score"], "missing column(s) ['config']"),
    ([("A", "bbq", "c1", "high"), ("B", "bbq", "c1", 0.2)], None, "non-numeric, NaN or infinite score in row(s) [2]"),
    ([("A", "bbq", "c1", None), ("B", "bbq", "c1", 0.2)], None, "row(s) [2]"),
    ([("A", "bbq", "c1", 0.1), ("A", "bbq", "c1", 0.3), ("B", "bbq", "c1", 0.2)], None,
     "duplicate (model, benchmark, config) rows: (A, bbq, c1)"),
    ([("A", "bbq", "c1", 0.1), ("B", "bbq", "c1", 0.3), ("A", "bbq", "c2", 0.2)], None,
     "missing cells:\n  bbq: B @ c2"),
])
def test_certify_malformed_tables(tmp_path, rows, cols, needle):
    p = tmp_path / "bad.csv"
    pd.DataFrame(rows, columns=cols or ["model", "benchmark", "config", "score"]).to_csv(p, index=False)
    r = run_cli("certify", str(p))
    assert r.returncode == 2
    assert str(p) in r.stderr
    assert needle in r.stderr
    assert r.stdout == ""


def test_certify_drop_incomplete(tmp_path):
    rows = HAND + [("A", "bbq", "c5", 0.1)]
    p = tmp_path / "inc.csv"
    _table(rows).to_csv(p, index=False)
    r = run_cli("certify", str(p), "--json", "--drop-incomplete")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["dropped_configs"] == {"bbq": ["c5"]}
    assert {x["benchmark"]: x["n_configs"] for x in j["pairs"]}["bbq"] == 4
    r = run_cli("certify", str(p), "--drop-incomplete")
    assert "dropped 1 incomplete config(s)" in r.stdout


def test_certify_missing_file(tmp_path):
    r = run_cli("certify", str(tmp_path / "nope.csv"))
    assert r.returncode == 2 and "file not found" in r.stderr


def test_certify_last_bit_means_tie_without_tol_and_tol_reaches_tau(tmp_path):
    """The issue's example: seeds [8,2,4,2,12]/12 and [7,2,5,2,12]/12 have equal counts but
    float means that differ in the last bit; certify must call them tied, and say why."""
    import numpy as np

    a = float(np.mean([k / 12 for k in (8, 2, 4, 2, 12)]))
    b = float(np.mean([k / 12 for k in (7, 2, 5, 2, 12)]))
    assert a != b
    rows = [("A", "bbq", "c1", a), ("B", "bbq", "c1", b), ("C", "bbq", "c1", 0.1),
            ("A", "bbq", "c2", 0.50), ("B", "bbq", "c2", 0.45), ("C", "bbq", "c2", 0.9)]
    p = tmp_path / "s.csv"
    _table(rows).to_csv(p, index=False, float_format="%.17g")
    r = run_cli("certify", str(p), "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["tie_rule"]["kind"] == "relative" and "1e-12" in j["tie_rule"]["text"]
    ab = next(x for x in j["pairs"] if (x["model_a"], x["model_b"]) == ("A", "B"))
    assert (ab["n_plus"], ab["n_minus"], ab["n_zero"]) == (1, 0, 1)
    bench = j["benchmarks"][0]
    assert bench["tied_configs"] == 1
    # c1 (A-B, A-C, B-C) = (0, +, +); c2 = (+, -, -): tau-b = -2/sqrt(6)
    assert bench["tau_r"] == pytest.approx(-2 / np.sqrt(6))
    # --tol 0.06 also ties c2's A-B gap of 0.05: c2 = (0, -, -), tau = -2/sqrt(2*2), and says so
    r = run_cli("certify", str(p), "--json", "--tol", "0.06")
    j = json.loads(r.stdout)
    assert j["tie_rule"]["kind"] == "absolute"
    assert j["benchmarks"][0]["tau_r"] == pytest.approx(-2 / 2)
    t = run_cli("certify", str(p))
    assert "ties: relative" in t.stdout


def test_certify_csv_outputs_neutralise_formula_names(tmp_path):
    """A model named like a spreadsheet formula is written as text ('=...), never as a formula;
    negative numbers stay numbers."""
    evil = ["=HYPERLINK(\"http://x\",\"y\")", "+cmd", "-2+3", "@SUM(A1)"]
    rows = []
    for bench, scores in (("bbq", (0.9, 0.5, 0.4, 0.3)), ("xstest", (0.2, 0.8, 0.6, 0.1))):
        for cfg, shift in (("c1", 0.0), ("c2", 0.05)):
            rows += [(m, bench, cfg, s + shift) for m, s in zip(evil, scores)]
    p = tmp_path / "scores.csv"
    _table(rows).to_csv(p, index=False)
    r = run_cli("certify", str(p), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    pairs = pd.read_csv(tmp_path / "out" / "pairs.csv")
    names = set(pairs["model_a"]) | set(pairs["model_b"])
    assert names == {"'" + m for m in evil}
    for f in (tmp_path / "out").glob("*.csv"):
        for line in f.read_text().splitlines():
            for cell in line.split(","):
                assert not cell.strip('"').startswith(("=", "+", "@")), (f.name, line)
    bench = pd.read_csv(tmp_path / "out" / "benchmarks.csv")
    assert bench["max_pair"].str.startswith("'").all() or bench["max_pair"].isna().all()
