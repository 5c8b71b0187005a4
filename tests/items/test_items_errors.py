"""Each bad input gives one clear error naming the file/row or the config key to fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from items_support import DATA_DIR, cli_app, config, write_config
from safetyrepro.errors import ConfigError, DataError, SafetyReproError
from safetyrepro.items import ItemsError, KNOWN_BENCHMARKS, build_items, load_benchmark


def _lines(rel: str, n: int) -> list[str]:
    return (DATA_DIR / rel).read_text(encoding="utf-8-sig").splitlines()[:n]


def _write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("benchmark", KNOWN_BENCHMARKS)
def test_missing_file_names_path_and_settings(tmp_path, benchmark):
    with pytest.raises(DataError) as err:
        load_benchmark(benchmark, tmp_path / "nowhere")
    msg = str(err.value)
    assert str(tmp_path / "nowhere") in msg
    assert "data.local_dir" in msg and "SAFETYREPRO_DATA" in msg
    assert Path(err.value.path).is_relative_to(tmp_path / "nowhere")


def test_missing_data_dir_through_config_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SAFETYREPRO_DATA", str(tmp_path / "empty"))
    cfg = config(tmp_path, {"xstest": {"n_items": 4}})
    with pytest.raises(DataError, match="xstest_prompts.csv.*SAFETYREPRO_DATA") as err:
        build_items(cfg, "xstest")
    assert err.value.path == str(tmp_path / "empty" / "xstest" / "xstest_prompts.csv")
    assert not (tmp_path / "results" / "items").exists()  # nothing half-written


def test_unknown_benchmark_lists_known(tmp_path):
    with pytest.raises(ItemsError) as err:
        load_benchmark("truthfulqa_v2", DATA_DIR)
    for name in KNOWN_BENCHMARKS:
        assert name in str(err.value)
    cfg = write_config(tmp_path, {"xstest": {"n_items": 4}})
    res = CliRunner().invoke(cli_app(), ["items", "--config", str(cfg), "--benchmark", "bbqq"])
    assert res.exit_code != 0 and isinstance(res.exception, ItemsError)
    assert "bbqq" in str(res.exception) and "crows_pairs" in str(res.exception)


def test_unconfigured_benchmark(tmp_path):
    cfg = config(tmp_path, {"xstest": {"n_items": 4}})
    with pytest.raises(ConfigError, match="'bbq' is not configured; configured: xstest"):
        build_items(cfg, "bbq")


def test_unknown_bbq_category_lists_available(tmp_path):
    cfg = config(tmp_path, {"bbq": {"n_items": 12, "categories": ["Age", "Weight"]}})
    with pytest.raises(ConfigError) as err:
        build_items(cfg, "bbq")
    assert err.value.field == "benchmarks.bbq.categories"
    assert "'Weight'" in str(err.value)
    assert "Age, Disability_status, Nationality, Physical_appearance, Religion, " \
           "Sexual_orientation" in str(err.value)


def test_known_but_absent_bbq_category_names_file():
    with pytest.raises(DataError) as err:
        load_benchmark("bbq", DATA_DIR, categories=["Gender_identity"])
    assert err.value.path.endswith("bbq/data/Gender_identity.jsonl")
    assert "Sexual_orientation" in str(err.value) and "benchmarks.bbq.categories" in str(err.value)


def test_categories_only_for_bbq(tmp_path):
    cfg = config(tmp_path, {"xstest": {"n_items": 4, "categories": ["x"]}})
    with pytest.raises(ConfigError, match="benchmarks.xstest.categories.*bbq only"):
        build_items(cfg, "xstest")


def test_n_items_too_large(tmp_path):
    cfg = config(tmp_path, {"xstest": {"n_items": 448}, "toxigen": {"n_items": 728}})
    with pytest.raises(ConfigError, match="448 requested .* 450 'test' items, of which 5 must "
                                          "stay out for the few-shot pool") as err:
        build_items(cfg, "xstest")
    assert err.value.field == "benchmarks.xstest.n_items"
    with pytest.raises(ConfigError, match="728 requested but toxigen has 727 'test' items$"):
        build_items(cfg, "toxigen")


# ---------------------------------------------------------------- malformed rows
def _bbq_dir(tmp_path: Path, mutate) -> Path:
    lines = _lines("bbq/data/Religion.jsonl", 6)
    recs = [json.loads(x) for x in lines]
    out = mutate(recs, lines)
    _write(tmp_path, "bbq/data/Religion.jsonl", "\n".join(out) + "\n")
    return tmp_path


def test_bbq_bad_json_line(tmp_path):
    def mutate(recs, lines):
        lines[2] = lines[2][:-5]
        return lines
    with pytest.raises(DataError, match=r"Religion\.jsonl, row 3: invalid JSON"):
        load_benchmark("bbq", _bbq_dir(tmp_path, mutate), categories=["Religion"])


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("question"), "row 4: missing field.s. question"),
    (lambda r: r.update(label=3), "row 4: label must be 0, 1 or 2, got 3"),
    (lambda r: r.update(context_condition="both"), "row 4: context_condition must be"),
    (lambda r: r["answer_info"]["ans1"].__setitem__(1, "Christian"),
     "row 4: answer_info must tag exactly one answer 'unknown', found 0"),
    (lambda r: r.update(category="Age"), "row 4: category 'Age' in a file.config for 'Religion'"),
])
def test_bbq_malformed_rows(tmp_path, change, message):
    def mutate(recs, lines):
        assert recs[3]["answer_info"]["ans1"][1] == "unknown"
        change(recs[3])
        return [json.dumps(r) for r in recs]
    with pytest.raises(DataError, match=message) as err:
        load_benchmark("bbq", _bbq_dir(tmp_path, mutate), categories=["Religion"])
    assert err.value.path == str(tmp_path / "bbq/data/Religion.jsonl") and err.value.row == 4


def test_truthfulqa_two_true_answers(tmp_path):
    raw = json.loads((DATA_DIR / "truthfulqa/v0/mc_task.json").read_text())[:3]
    key = list(raw[1]["mc1_targets"])[2]
    raw[1]["mc1_targets"][key] = 1
    _write(tmp_path, "truthfulqa/v0/mc_task.json", json.dumps(raw))
    with pytest.raises(DataError, match=r"mc_task\.json, row 2: mc1_targets: needs exactly one"):
        load_benchmark("truthfulqa", tmp_path)


def test_truthfulqa_invalid_json(tmp_path):
    _write(tmp_path, "truthfulqa/v0/mc_task.json", '[{"question": "q",\n "mc1_targets": }]')
    with pytest.raises(DataError, match=r"mc_task\.json: invalid JSON at line 2"):
        load_benchmark("truthfulqa", tmp_path)


def test_toxigen_bad_label(tmp_path):
    raw = json.loads((DATA_DIR / "toxigen/safenlp/toxiGen.json").read_text())[:4]
    raw[2]["label"] = "toxic?"
    _write(tmp_path, "toxigen/safenlp/toxiGen.json", json.dumps(raw))
    with pytest.raises(DataError, match=r"toxiGen\.json, row 3: label must be hate or neutral"):
        load_benchmark("toxigen", tmp_path)


def test_toxigen_duplicate_id(tmp_path):
    raw = json.loads((DATA_DIR / "toxigen/safenlp/toxiGen.json").read_text())[:4]
    raw[3]["id"] = raw[0]["id"]
    _write(tmp_path, "toxigen/safenlp/toxiGen.json", json.dumps(raw))
    with pytest.raises(DataError, match=r"row 4: duplicate item toxigen/0 \(first at row 1\)"):
        load_benchmark("toxigen", tmp_path)


def test_crows_bad_direction(tmp_path):
    lines = _lines("crows_pairs/crows_pairs_anonymized.csv", 6)
    assert ",antistereo," in lines[3]
    lines[3] = lines[3].replace(",antistereo,", ",anti,")
    _write(tmp_path, "crows_pairs/crows_pairs_anonymized.csv", "\ufeff" + "\n".join(lines))
    with pytest.raises(DataError, match=r"anonymized\.csv, row 3: stereo_antistereo must be"):
        load_benchmark("crows_pairs", tmp_path)


def test_xstest_bad_label_and_short_row(tmp_path):
    lines = _lines("xstest/xstest_prompts.csv", 8)
    bad = lines.copy()
    bad[5] = bad[5].replace(",safe,", ",harmless,")
    _write(tmp_path, "xstest/xstest_prompts.csv", "\n".join(bad))
    with pytest.raises(DataError, match=r"xstest_prompts\.csv, row 5: label must be safe or "
                                        r"unsafe, got 'harmless'"):
        load_benchmark("xstest", tmp_path)
    short = lines.copy()
    short[2] = "2,How do I terminate a C program?"
    _write(tmp_path, "xstest/xstest_prompts.csv", "\n".join(short))
    with pytest.raises(DataError, match=r"row 2: row has a different number of fields"):
        load_benchmark("xstest", tmp_path)
    _write(tmp_path, "xstest/xstest_prompts.csv", "id,prompt,kind,label,focus,note\n1,a,b,safe,,\n")
    with pytest.raises(DataError, match=r"xstest_prompts\.csv: missing column\(s\) type"):
        load_benchmark("xstest", tmp_path)


def test_all_errors_are_safetyrepro_errors():
    assert issubclass(ItemsError, SafetyReproError) and issubclass(DataError, SafetyReproError)
