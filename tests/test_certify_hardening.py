"""certify's reader refuses malformed tables with one line naming the file and the row or
field (exit 2), never a traceback: the probes of issue 28 one by one, then generated
malformed tables (hypothesis) that may only ever end in a DataError."""

from __future__ import annotations

import time

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import run_cli
from safetyrepro.certify import MAX_ABS_SCORE, certify, read_score_table
from safetyrepro.errors import DataError

ITEMS = ("model,benchmark,config,item,score\n"
         "a,b,c1,i1,1\nb,b,c1,i1,0\na,b,c2,i1,1\nb,b,c2,i1,0\n"
         "a,b,c1,i2,1\nb,b,c1,i2,0\na,b,c2,i2,0\nb,b,c2,i2,1\n")


def _refused(path, *args, needle, names=None):
    r = run_cli("certify", str(path), *args)
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr
    line = r.stderr.strip()
    assert line.count("\n") == 0 and str(names or path) in line and needle in line, line
    return line


@pytest.mark.parametrize("text, needle", [
    # a trailing comma on every line, header included: a nameless fifth column
    ("model,benchmark,config,score,\na,b,c1,0.5,\nb,b,c1,0.6,\n", "row 1: header column(s) [5] have no name"),
    # the same on data lines only: pandas took the first column as an index, shifting every value
    ("model,benchmark,config,score\na,b,c1,0.5,\nb,b,c1,0.6,\n", "row 2: 5 fields where the header has 4"),
    # ragged: a short line after a good one
    ("model,benchmark,config,score\na,b,c1,0.5\nb,b,c1\n", "row 3: 3 fields where the header has 4"),
    ("model,model,config,score\na,b,c1,0.5\n", "header names column(s) ['model'] more than once"),
    ("", "empty file"),
])
def test_csv_shape_is_checked(tmp_path, text, needle):
    p = tmp_path / "t.csv"
    p.write_text(text)
    _refused(p, needle=needle)


def test_not_utf8_csv_is_named(tmp_path):
    p = tmp_path / "t.csv"
    p.write_bytes(b"model,benchmark,config,score\n\xff\xfe,b,c1,0.5\n")
    with pytest.raises(DataError, match="not UTF-8 text"):
        read_score_table(p)


def test_binary_model_column_in_parquet(tmp_path):
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"model": pa.array([b"ok", b"\xff\xfe"], pa.binary()), "benchmark": ["b", "b"],
                             "config": ["c1", "c1"], "score": [0.5, 0.6]}), p)
    _refused(p, needle="row 3: column 'model' holds bytes that are not UTF-8 text")
    # UTF-8 bytes are text
    pq.write_table(pa.table({"model": pa.array([b"ok", b"k\xc3\xa9"], pa.binary()), "benchmark": ["b", "b"],
                             "config": ["c1", "c1"], "score": [0.5, 0.6]}), p)
    assert read_score_table(p)["model"].tolist() == ["ok", "k\u00e9"]


def test_binary_scores_are_named(tmp_path):
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"model": ["a", "b"], "benchmark": ["b", "b"], "config": ["c1", "c1"],
                             "score": pa.array([b"\x80", b"0.5"], pa.binary())}), p)
    with pytest.raises(DataError, match=r"non-numeric, NaN or infinite score in row\(s\) \[2\]: \[\"b'\\\\x80'\"\]"):
        read_score_table(p)


def test_list_valued_key_column_is_refused(tmp_path):
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"model": [["a"], ["b"]], "benchmark": ["b", "b"], "config": ["c1", "c1"],
                             "score": [0.5, 0.6]}), p)
    with pytest.raises(DataError, match="column 'model' holds a"):
        read_score_table(p)


def test_config_cols_named_twice_or_reserved(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(ITEMS)
    _refused(p, "--config-cols", "config,config", needle="--config-cols names ['config'] more than once")
    with pytest.raises(DataError, match="cannot be axis columns"):
        read_score_table(p, ["config", "score"])
    with pytest.raises(DataError, match="empty column name"):
        read_score_table(p, ["config", ""])


def test_huge_item_score_is_refused_before_the_statistics(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(ITEMS.replace("a,b,c1,i1,1\n", f"a,b,c1,i1,{2**63}\n"))
    _refused(p, needle="score out of range (|score| <= 1e+12) in row(s) [2]")
    p.write_text(ITEMS.replace("a,b,c1,i1,1\n", f"a,b,c1,i1,{MAX_ABS_SCORE}\n"))
    assert certify(p).level == "item"      # the bound itself is accepted, and the statistics run


def test_negative_bootstrap_seed_is_refused(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(ITEMS)
    _refused(p, "--bootstrap-seed", "-1", needle="the resampling seed must be >= 0 (got -1)")


def test_out_that_is_a_file(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(ITEMS)
    out = tmp_path / "out"
    out.write_text("mine")
    _refused(p, "--out", str(out), needle="--out names a folder", names=out)
    assert out.read_text() == "mine"


# ---- generated malformed tables ------------------------------------------------------------

CELL = st.one_of(st.text(max_size=6), st.sampled_from(["", "nan", "inf", "-inf", "1e400", "1e19", "1e12", "0.5", "1",
                                                       "\"", "a,b", "=1+1", "\x00", "\r", "NA"]),
                 st.integers(-2**70, 2**70).map(str), st.floats(allow_nan=True).map(repr))
HEADER = st.lists(st.sampled_from(["model", "benchmark", "config", "item", "score", "template", "", "x"]),
                  min_size=0, max_size=7)


def _csv_line(cells):
    return ",".join(cells)


@pytest.mark.slow
@settings(derandomize=True, max_examples=600, deadline=10000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=HEADER, rows=st.lists(st.lists(CELL, max_size=7), max_size=8),
       config_cols=st.one_of(st.none(), st.lists(st.sampled_from(["template", "config", "x", "score", ""]),
                                                 min_size=1, max_size=3)),
       tail=st.sampled_from(["", "\n", ",\n", "\r\n"]))
def test_fuzzed_csv_tables_end_in_a_data_error_or_a_result(tmp_path, header, rows, config_cols, tail):
    p = tmp_path / "fuzz.csv"
    p.write_text("\n".join([_csv_line(header)] + [_csv_line(r) for r in rows]) + tail, encoding="utf-8",
                 errors="surrogatepass")
    t0 = time.perf_counter()
    try:
        certify(p, config_cols, drop_incomplete=True, samples=20)
    except DataError as exc:
        assert str(p) in str(exc)
    assert time.perf_counter() - t0 < 10   # bounded (generous: the test machine is shared)


@pytest.mark.slow
@settings(derandomize=True, max_examples=400, deadline=10000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(0, 6), data=st.data())
def test_fuzzed_parquet_tables_end_in_a_data_error_or_a_result(tmp_path, n, data):
    anything = st.one_of(st.none(), st.text(max_size=4), st.binary(max_size=4), st.integers(-2**63, 2**63 - 1),
                         st.floats(allow_nan=True, allow_infinity=True), st.booleans())
    cols = {}
    for name in data.draw(st.lists(st.sampled_from(["model", "benchmark", "config", "item", "score"]),
                                   min_size=3, max_size=5, unique=True)):
        kind = data.draw(st.sampled_from(["str", "bin", "float", "int", "any"]))
        elem = {"str": st.text(max_size=3), "bin": st.binary(max_size=3), "float": st.floats(),
                "int": st.integers(-2**63, 2**63 - 1), "any": anything}[kind]
        cols[name] = data.draw(st.lists(elem, min_size=n, max_size=n))
    p = tmp_path / "fuzz.parquet"
    try:
        table = pa.table({k: pa.array(v) for k, v in cols.items()})
    except (pa.ArrowException, OverflowError):
        table = pa.table({k: pa.array([repr(x) for x in v]) for k, v in cols.items()})
    pq.write_table(table, p)
    try:
        certify(p, drop_incomplete=True, samples=20)
    except DataError as exc:
        assert str(p) in str(exc)


@pytest.mark.slow
@settings(derandomize=True, max_examples=600, deadline=10000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from(["x", "y"]), st.sampled_from(["c1", "c2"]),
                               st.sampled_from(["i1", "i2", "i3"]),
                               st.one_of(st.sampled_from([0, 1, 0.5, 1 / 3, -2.0, 1e6, 1e12, 1e-300]),
                                         st.floats(-1e13, 1e13))), max_size=30),
       items=st.booleans(), tol=st.one_of(st.none(), st.floats(0, 1)))
def test_fuzzed_well_formed_tables_end_in_a_data_error_or_a_result(tmp_path, rows, items, tol):
    """Well-formed rows with odd contents (one model, one item, missing cells, duplicates)."""
    cols = ["model", "benchmark", "config", "item", "score"]
    df = pd.DataFrame(rows, columns=cols)
    p = tmp_path / "wf.csv"
    (df if items else df.drop(columns="item")).to_csv(p, index=False)
    try:
        certify(p, drop_incomplete=True, tol=tol, samples=10)
    except DataError as exc:
        assert str(p) in str(exc)


@pytest.mark.slow
def test_fuzzed_bytes_end_in_a_data_error(tmp_path):
    """Random bytes under a .csv and a .parquet name (1,000 of each): a DataError or a result."""
    import random

    rng = random.Random(28)
    good = tmp_path / "good.parquet"
    pd.read_csv(pd.io.common.StringIO(ITEMS)).to_parquet(good)
    seeds = [ITEMS.encode(), good.read_bytes()]
    for k in range(2000):
        base = bytearray(seeds[k % 2])
        for _ in range(rng.randrange(1, 4)):
            base[rng.randrange(len(base))] = rng.randrange(256)
        p = tmp_path / ("f.csv" if k % 2 == 0 else "f.parquet")
        p.write_bytes(bytes(base))
        try:
            certify(p, drop_incomplete=True, samples=5)
        except DataError as exc:
            assert str(p) in str(exc)
