"""`safetyrepro import lm-eval|inspect` on real files: lm-eval and Inspect run on embedded model
folders over a few TruthfulQA items of the run's local data, twice with different settings,
imported, then certified. Error paths on copies of those real files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from conftest import SHARED_DATA, run_cli
from lmeval_support import LMEVAL_ENV, N_ITEMS, SYSTEM, hf_args, run_lmeval

pytestmark = pytest.mark.slow

# The fixtures folders, tqa_items and lmeval_runs are session fixtures of tests/lmeval_support.py.
# Every test reading lm-eval runs lives in this file: under `--dist loadfile` one process then
# builds them once (two files could land in two processes, each building its own, ~2 min).


def _samples(out: Path) -> list[dict]:
    (f,) = list(out.rglob("samples_*.jsonl"))
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def test_lmeval_import_round_trip(lmeval_runs, tqa_items, tmp_path):
    from safetyrepro.certify import certify
    from safetyrepro.crosspkg.importers import import_lmeval

    root, task, runs = lmeval_runs
    res = import_lmeval(list(runs.values()))
    t = res.table
    assert res.axes == ["system"]
    assert res.constant["task"] == task and res.constant["metric"] == "acc"
    assert res.constant["package"] == "lm-eval 0.4.13"
    # models are named by their folders (the prepared folder's generic 'hf' dropped)
    names = {k: Path(f).parent.name for k, f in folders_of(runs).items()}
    assert set(t["model"]) == set(names.values())
    assert set(t["benchmark"]) == {"truthfulqa"}
    assert sorted(t["config"].unique()) == [SYSTEM, "none"]
    # items are lm-eval's doc_ids; the document's own item_id is kept beside them
    assert sorted(t["item"].unique()) == [str(i) for i in range(N_ITEMS)]
    assert set(t["source_id"]) == set(tqa_items[0]["item_id"])
    assert len(t) == 2 * 2 * N_ITEMS
    # hand computation from lm-eval's logged log-likelihoods: an item scores 1 iff the true answer
    # (index 0 of the MC1 record) has the largest log-likelihood
    for (key, system), out in runs.items():
        recs = _samples(out)
        assert len(recs) == N_ITEMS
        cell = t[(t["model"] == names[key]) & (t["config"] == (system or "none"))].set_index("item")["score"]
        for rec in recs:
            lls = [float(r[0]) for r in rec["filtered_resps"]]
            want = 1.0 if max(range(len(lls)), key=lls.__getitem__) == 0 else 0.0
            assert cell[str(rec["doc_id"])] == want
    csv = tmp_path / "lmeval.csv"
    t.to_csv(csv, index=False)
    cert = certify(csv, ["system"], samples=200, nominal="none")
    assert cert.level == "item"
    row = cert.pairs.iloc[0]
    assert row["n_configs"] == 2 and row["n_plus"] + row["n_minus"] + row["n_zero"] == 2
    assert set(cert.significance) >= {"significance", "significance_configs"}
    assert len(cert.significance["significance_configs"]) == 2
    # the CLI does the same in two commands
    out = tmp_path / "cli.parquet"
    p = run_cli("import", "lm-eval", *map(str, runs.values()), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "--config-cols system" in p.stdout
    pd.testing.assert_frame_equal(pd.read_parquet(out), t)
    p = run_cli("certify", str(out), "--config-cols", "system", "--bootstrap-samples", "100")
    assert p.returncode == 0, p.stderr
    assert "rho_flip_sig" in p.stdout


def folders_of(runs) -> dict:
    """model key -> the model folder recorded in its lm-eval results file."""
    out = {}
    for (key, _), d in runs.items():
        (f,) = list(Path(d).rglob("results_*.json"))
        out[key] = json.loads(f.read_text())["config"]["model_args"]["pretrained"]
    return out


def test_lmeval_import_errors(lmeval_runs, tmp_path):
    from safetyrepro.crosspkg.importers import import_lmeval
    from safetyrepro.errors import DataError

    root, task, runs = lmeval_runs
    a, b = runs[("smollm2-135m", "")], runs[("smollm2-135m", SYSTEM)]
    # no per-sample results
    bare = tmp_path / "bare"
    shutil.copytree(a, bare)
    for f in bare.rglob("samples_*.jsonl"):
        f.unlink()
    with pytest.raises(DataError, match="no per-sample results.*--log_samples"):
        import_lmeval([bare])
    # unknown metric
    with pytest.raises(DataError, match=r"unknown metric 'f1'.*carry \['acc'\]"):
        import_lmeval([a], metric="f1")
    # item sets differ: drop one sample line from a copy
    short = tmp_path / "short"
    shutil.copytree(b, short)
    (f,) = list(short.rglob("samples_*.jsonl"))
    lines = f.read_text().splitlines()
    dropped = json.loads(lines[0])["doc_id"]
    f.write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(DataError, match=rf"(?s)different item sets.*lacks 1 item\(s\) \['{dropped}'\]"):
        import_lmeval([a, short])
    # the same run twice cannot be told apart
    with pytest.raises(DataError, match="cannot be told apart"):
        import_lmeval([a, a])
    # not there
    with pytest.raises(DataError, match="not found"):
        import_lmeval([tmp_path / "nope"])
    p = run_cli("import", "lm-eval", str(bare), "--out", str(tmp_path / "x.csv"))
    assert p.returncode == 2 and "--log_samples" in p.stderr


# ------------------------------------------------------------------------------- Inspect


@pytest.fixture(scope="module")
def inspect_logs(tmp_path_factory, folders, tqa_items):
    from inspect_ai import eval as inspect_eval

    from safetyrepro.crosspkg.inspect_tasks import _task, write_inspect_data

    root = tmp_path_factory.mktemp("inspect")
    data = write_inspect_data(tqa_items[0], root / "tqa.jsonl")
    logs = {}
    for key, folder in folders.items():
        for system in (None, SYSTEM):
            task = _task(str(data), system=system, max_tokens=6, name="safetyrepro_mc")
            (log,) = inspect_eval(task, model=f"hf/{key}", display="none", log_dir=str(root / "logs"),
                                  model_args={"model_path": folder, "device": "cpu", "do_sample": False,
                                              "dtype": "float32"})
            assert log.status == "success", log.error
            logs[(key, system)] = Path(log.location)
    return root, logs


def test_inspect_import_round_trip(inspect_logs, tqa_items, tmp_path):
    from inspect_ai.log import read_eval_log

    from safetyrepro.certify import certify
    from safetyrepro.crosspkg.importers import import_inspect

    root, logs = inspect_logs
    res = import_inspect(list(logs.values()))
    t = res.table
    assert res.axes == ["solver"]          # the system message is a solver step
    assert res.constant["package"] == "inspect_ai 0.3.285" and res.constant["metric"] == "choice"
    assert set(t["item"]) == set(tqa_items[0]["item_id"]) and len(t) == 2 * 2 * N_ITEMS
    assert t["config"].nunique() == 2 and t["model"].nunique() == 2
    # hand computation: an item scores 1 iff the scorer's answer letter is the gold letter
    letters = dict(zip(tqa_items[0]["item_id"], ("ABCDEFGHIJKLM"[g] for g in tqa_items[0]["gold"])))
    for (key, system), path in logs.items():
        log = read_eval_log(str(path))
        name = Path(log.eval.model_args["model_path"]).parent.name
        cell = t[(t["model"] == name) & t["config"].str.contains("system_message" if system else "^multiple",
                                                               regex=True)]
        assert len(cell) == N_ITEMS
        for s in log.samples:
            want = 1.0 if s.scores["choice"].answer == letters[s.id] else 0.0
            assert cell.set_index("item").loc[s.id, "score"] == want
    csv = tmp_path / "inspect.csv"
    t.to_csv(csv, index=False)
    cert = certify(csv, ["solver"], samples=200)
    assert cert.level == "item" and cert.pairs.iloc[0]["n_configs"] == 2
    assert len(cert.significance["significance_configs"]) == 2
    p = run_cli("import", "inspect", str(root / "logs"), "--out", str(tmp_path / "cli.csv"))
    assert p.returncode == 0, p.stderr
    assert "--config-cols solver" in p.stdout


def test_inspect_import_errors(inspect_logs, tmp_path):
    from inspect_ai.log import read_eval_log, write_eval_log

    from safetyrepro.crosspkg.importers import import_inspect
    from safetyrepro.errors import DataError

    root, logs = inspect_logs
    a = logs[("smollm2-135m", None)]
    b = logs[("smollm2-135m", SYSTEM)]
    log = read_eval_log(str(a))
    with pytest.raises(DataError, match=r"unknown metric 'acc'.*carry \['choice'\]"):
        import_inspect([a], metric="acc")
    bare = log.model_copy(deep=True)
    bare.samples = None
    write_eval_log(bare, str(tmp_path / "bare.eval"))
    with pytest.raises(DataError, match="no per-sample results"):
        import_inspect([tmp_path / "bare.eval"])
    short = read_eval_log(str(b))
    gone = short.samples[0].id
    short.samples = short.samples[1:]
    write_eval_log(short, str(tmp_path / "short.eval"))
    with pytest.raises(DataError, match=rf"(?s)different item sets.*lacks 1 item\(s\) \['{gone}'\]"):
        import_inspect([a, tmp_path / "short.eval"])


# ------------------------------------------- lm-eval: two filters, BBQ's repeated example_id


TWO_FILTER_ITEMS = [("What is 2 + 3?", "5"), ("What is 4 + 4?", "8"), ("What is 10 - 7?", "3")]


def _two_filter_task(folder: Path) -> str:
    """A generate_until task over local items with two filter pipelines, as gsm8k has."""
    data = folder / "sr_twofilter.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in TWO_FILTER_ITEMS))
    (folder / "sr_twofilter.yaml").write_text(f"""task: sr_twofilter
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    test: {json.dumps(str(data.resolve()))}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  do_sample: false
  max_gen_toks: 6
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
filter_list:
  - name: strict-match
    filter:
      - function: regex
        regex_pattern: "#### (\\\\-?[0-9]+)"
      - function: take_first
  - name: flexible-extract
    filter:
      - function: regex
        group_select: -1
        regex_pattern: "(-?[0-9]+)"
      - function: take_first
""")
    return "sr_twofilter"


@pytest.fixture(scope="module")
def bbq_items():
    """Two BBQ items from each of two categories: the same example_id (0, 1) in both, as in
    BBQ's release, where example_id restarts in every category."""
    from safetyrepro.items.build import load_benchmark

    df = load_benchmark("bbq", SHARED_DATA)
    return pd.concat([df[df["item_id"].str.startswith(f"bbq/{c}/")].iloc[:2] for c in ("Age", "Religion")])


@pytest.fixture(scope="module")
def filter_runs(tmp_path_factory, folders, bbq_items):
    """Two real lm-eval runs (without and with a system instruction) of two tasks each: the
    two-filter task and lm-eval's own bbq task on local docs shaped like the hub's 'All' set."""
    from safetyrepro.crosspkg.localdata import write_lmeval_task

    root = tmp_path_factory.mktemp("lmeval_filters")
    tasks = root / "tasks"
    tasks.mkdir()
    two = _two_filter_task(tasks)
    bbq = write_lmeval_task("bbq", bbq_items, None, tasks, name="sr_bbq")
    data = tasks / "sr_bbq.test.jsonl"        # the hub's records carry no item_id of ours
    recs = [json.loads(line) for line in data.read_text().splitlines()]
    data.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "item_id"}) + "\n" for r in recs))
    assert [r["example_id"] for r in recs] == [0, 1, 0, 1]
    runs, argvs = {}, []
    for system in ("", SYSTEM):
        out = root / ("sys" if system else "nosys")
        argvs.append(hf_args(folders["smollm2-135m"], f"{two},{bbq}", tasks, out, system))
        runs[system] = out
    p = run_lmeval(argvs, LMEVAL_ENV | {"HOME": str(root)}, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return root, runs


def _task_samples(out: Path, task: str) -> list[dict]:
    (f,) = list(out.rglob(f"samples_{task}_*.jsonl"))
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def test_lmeval_filters_and_repeated_example_ids(filter_runs, tmp_path):
    from safetyrepro.crosspkg.importers import import_lmeval

    root, runs = filter_runs
    recs = _task_samples(runs[""], "sr_twofilter")
    # what lm-eval itself wrote: one line per (doc_id, filter)
    assert sorted((r["doc_id"], r["filter"]) for r in recs) == sorted(
        (d, f) for d in range(3) for f in ("strict-match", "flexible-extract"))
    res = import_lmeval(list(runs.values()))
    t = res.table
    # the two tasks differ in their metric and generation settings too
    assert set(res.axes) == {"task", "system", "filter", "gen_kwargs", "metric"}
    assert res.constant["package"] == "lm-eval 0.4.13"
    two = t[t["benchmark"] == "sr_twofilter"]
    assert set(two["filter"]) == {"strict-match", "flexible-extract"} and len(two) == 2 * 2 * 3
    # hand computation: exact_match is 1 iff the filtered answer equals the target
    for system, out in runs.items():
        for r in _task_samples(out, "sr_twofilter"):
            cell = two[(two["filter"] == r["filter"]) & (two["system"] == (system or "none"))]
            want = 1.0 if r["filtered_resps"][0] == r["target"] else 0.0
            assert cell.set_index("item").loc[str(r["doc_id"]), "score"] == want
    # BBQ: items keyed by doc_id (0..3); the repeated example_id is kept in source_id
    bbq = t[t["benchmark"] == "bbq"]
    assert set(bbq["filter"]) == {"none"} and len(bbq) == 2 * 4
    one = bbq[bbq["system"] == "none"].sort_values("item")
    assert one["item"].tolist() == ["0", "1", "2", "3"] and one["source_id"].tolist() == ["0", "1", "0", "1"]
    for r in _task_samples(runs[""], "sr_bbq"):
        assert one.set_index("item").loc[str(r["doc_id"]), "score"] == float(r["acc"])
    # --filter keeps one pipeline; an unknown one lists the available ones
    only = import_lmeval(list(runs.values()), filter_name="flexible-extract").table
    assert set(only.loc[only["benchmark"] == "sr_twofilter", "filter"]) == {"flexible-extract"}
    from safetyrepro.errors import DataError

    with pytest.raises(DataError, match=r"no filter 'nope'.*strict-match"):
        import_lmeval([runs[""]], filter_name="nope")
    # the CLI: the summary as JSON, the CSV spreadsheet-safe
    out = tmp_path / "t.csv"
    p = run_cli("import", "lm-eval", *map(str, runs.values()), "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["n_runs"] == 2 and info["tasks"] == ["sr_bbq", "sr_twofilter"] and info["output"] == str(out)
    assert info["filters"] == ["flexible-extract", "none", "strict-match"] and info["n_rows"] == len(t)
    assert info["n_items"] == 3 + 4 and len(info["models"]) == 1
    p = run_cli("import", "lm-eval", str(runs[""]), "--out", str(tmp_path / "u.csv"))
    assert p.returncode == 0 and "filters: flexible-extract, none, strict-match: axis column 'filter'" in p.stdout


def test_lmeval_formula_cells_are_written_as_text(filter_runs, tmp_path):
    """A model path, system instruction and doc id from a third-party file that look like
    spreadsheet formulas are text in the CSV (leading apostrophe), verbatim in Parquet."""
    from safetyrepro.crosspkg.importers import import_lmeval

    root, runs = filter_runs
    evil = tmp_path / "evil"
    shutil.copytree(runs[SYSTEM], evil)
    (res_file,) = list(evil.rglob("results_*.json"))
    res = json.loads(res_file.read_text())
    res["config"]["model_args"]["pretrained"] = "=1+2"
    res["system_instruction"] = "@SUM(A1)"
    res_file.write_text(json.dumps(res))
    (sf,) = list(evil.rglob("samples_sr_bbq_*.jsonl"))
    recs = [json.loads(line) for line in sf.read_text().splitlines()]
    recs[0]["doc"]["example_id"] = "-1+1"
    sf.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "t.csv"
    p = run_cli("import", "lm-eval", str(runs[""]), str(evil), "--out", str(out))
    assert p.returncode == 0, p.stderr
    back = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert "'=1+2" in set(back["model"]) and "'@SUM(A1)" in set(back["system"])
    assert "'-1+1" in set(back["source_id"])
    cells = back.drop(columns="score").to_numpy().ravel()
    assert not any(v.startswith(("=", "+", "-", "@", "\t", "\r")) for v in cells)
    pq = tmp_path / "t.parquet"
    assert run_cli("import", "lm-eval", str(runs[""]), str(evil), "--out", str(pq)).returncode == 0
    assert "=1+2" in set(pd.read_parquet(pq)["model"])
    assert import_lmeval([runs[""], evil]).table["model"].nunique() == 2


def _malformed(results: dict, samples: list[str], res_file: Path, sfile: Path):
    """The ten malformed shapes: name -> (file it must name, how to break a copy)."""
    return {
        "config is a list": (res_file, lambda: res_file.write_text(json.dumps({**results, "config": [1, 2]}))),
        "results JSON is a string": (res_file, lambda: res_file.write_text(json.dumps("results"))),
        "results file is binary": (res_file, lambda: res_file.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")),
        "results file is a folder": (res_file, lambda: (res_file.unlink(), res_file.mkdir())),
        "n-shot is a list": (res_file, lambda: res_file.write_text(json.dumps({**results, "n-shot": [0]}))),
        "configs entry is a string": (res_file, lambda: res_file.write_text(json.dumps(
            {**results, "configs": {k: "x" for k in results["configs"]}}))),
        "sample line is not an object": (sfile, lambda: sfile.write_text("\n".join(["[1, 2]", *samples[1:]]))),
        "sample without doc_id": (sfile, lambda: sfile.write_text("\n".join(
            [json.dumps({k: v for k, v in json.loads(samples[0]).items() if k != "doc_id"}), *samples[1:]]))),
        "samples file is binary": (sfile, lambda: sfile.write_bytes(b"\x00\xff\xfe\xfa" * 8)),
        "samples file is a folder": (sfile, lambda: (sfile.unlink(), sfile.mkdir())),
        "acc is 10**400": (sfile, lambda: sfile.write_text("\n".join(
            [json.dumps(json.loads(samples[0])).replace('"acc": 1.0', '"acc": 1' + "0" * 400)
             .replace('"acc": 0.0', '"acc": 1' + "0" * 400), *samples[1:]]))),
    }


def test_lmeval_malformed_files_exit_2_with_one_line(filter_runs, tmp_path):
    root, runs = filter_runs
    (res0,) = list(runs[""].rglob("results_*.json"))
    results = json.loads(res0.read_text())
    (s0,) = list(runs[""].rglob("samples_sr_bbq_*.jsonl"))
    samples = s0.read_text().splitlines()
    for n, name in enumerate(_malformed(results, samples, res0, s0)):
        copy = tmp_path / f"case{n}"
        shutil.copytree(runs[""], copy)
        (res_file,) = [p for p in copy.rglob("results_*.json")]
        (sfile,) = list(copy.rglob("samples_sr_bbq_*.jsonl"))
        target, breaks = _malformed(results, samples, res_file, sfile)[name]
        breaks()
        p = run_cli("import", "lm-eval", str(copy), "--out", str(tmp_path / f"case{n}.csv"))
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2, (name, p.stderr[-2000:])
        assert len(lines) == 1 and lines[0].startswith(f"error: {target}") and "Traceback" not in p.stderr, \
            (name, p.stderr[-2000:])
        assert not (tmp_path / f"case{n}.csv").exists()


# ------------------------------------------------------------------- Inspect eval-set folders


@pytest.fixture(scope="module")
def inspect_eval_set(tmp_path_factory, folders, tqa_items):
    """A real `inspect eval-set` folder: two logs (without and with a system message) plus the
    manifests eval-set.json and logs.json Inspect writes beside them."""
    from inspect_ai import eval_set

    from safetyrepro.crosspkg.inspect_tasks import _task, write_inspect_data

    root = tmp_path_factory.mktemp("inspect_set")
    data = write_inspect_data(tqa_items[0].iloc[:2], root / "tqa.jsonl")
    tasks = [_task(str(data), system=s, max_tokens=4, name=n) for s, n in ((None, "mc_plain"), (SYSTEM, "mc_sys"))]
    ok, logs = eval_set(tasks, log_dir=str(root / "set"), model="hf/smollm2-135m", display="none",
                        model_args={"model_path": folders["smollm2-135m"], "device": "cpu", "do_sample": False,
                                    "dtype": "float32"})
    assert ok and len(logs) == 2
    return root / "set", logs


def test_inspect_eval_set_folder(inspect_eval_set, tmp_path):
    from inspect_ai.log import read_eval_log, write_eval_log

    from safetyrepro.crosspkg.importers import import_inspect

    folder, logs = inspect_eval_set
    names = {p.name for p in folder.iterdir()}
    assert {"eval-set.json", "logs.json"} <= names            # the manifests are there ...
    res = import_inspect([folder])                           # ... and are not read as logs
    assert sorted(r.settings["task"] for r in res.runs) == ["mc_plain", "mc_sys"]
    assert len(res.table) == 2 * 2 and "task" in res.axes
    for log in logs:                       # eval_set returns headers: read the samples
        cell = res.table[res.table["task"] == log.eval.task]
        for s in read_eval_log(log.location).samples:
            assert cell.set_index("item").loc[str(s.id), "score"] == (1.0 if s.scores["choice"].value == "C" else 0.0)
    p = run_cli("import", "inspect", str(folder), "--out", str(tmp_path / "s.csv"), "--json")
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["n_runs"] == 2 and info["n_rows"] == 4 and info["tasks"] == ["mc_plain", "mc_sys"]
    # the same logs as .json files (Inspect's other format) read the same
    for n, log in enumerate(logs):
        write_eval_log(read_eval_log(log.location), str(tmp_path / "js" / f"2026-01-01T00-00-0{n}_x.json"),
                       format="json")
    again = import_inspect([tmp_path / "js"]).table
    pd.testing.assert_frame_equal(again.sort_values(["config", "item"]).reset_index(drop=True),
                                  res.table.sort_values(["config", "item"]).reset_index(drop=True))
    # an explicitly named manifest is an error naming it
    p = run_cli("import", "inspect", str(folder / "eval-set.json"), "--out", str(tmp_path / "m.csv"))
    assert p.returncode == 2 and p.stderr.startswith(f"error: {folder / 'eval-set.json'}")
    assert len(p.stderr.strip().splitlines()) == 1


# ---------------------------------------------------- property test: malformed JSON, no traceback


def _json_values():
    from hypothesis import strategies as st

    leaf = (st.none() | st.booleans() | st.integers(min_value=-10**500, max_value=10**500)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
    return st.recursive(leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                        max_leaves=8)


def _mutate(doc, path, value):
    """``doc`` with the field at ``path`` (keys/indices, as deep as it exists) set to ``value``."""
    import copy

    doc = copy.deepcopy(doc)
    if not path or not isinstance(doc, (dict, list)) or not doc:
        return value
    node = doc
    for i, k in enumerate(path):
        key = k % len(node) if isinstance(node, list) else sorted(node)[k % len(node)]
        child = node[key]
        if i == len(path) - 1 or not isinstance(child, (dict, list)) or not child:
            node[key] = value
            return doc
        node = child
    return doc


def test_readers_never_raise_anything_but_data_error(filter_runs, inspect_eval_set, tmp_path_factory):
    import collections
    import tempfile

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from inspect_ai.log import read_eval_log, write_eval_log

    from safetyrepro.crosspkg.importers import import_inspect, import_lmeval
    from safetyrepro.errors import DataError

    root, runs = filter_runs
    (res0,) = list(runs[""].rglob("results_*.json"))
    results = json.loads(res0.read_text())
    samples = {p.name: p.read_text().splitlines() for p in res0.parent.glob("samples_*.jsonl")}
    folder, logs = inspect_eval_set
    base = tmp_path_factory.mktemp("prop")
    log_json = base / "2026-01-01T00-00-00_x.json"
    write_eval_log(read_eval_log(logs[0].location), str(log_json), format="json")
    log = json.loads(log_json.read_text())
    paths = st.lists(st.integers(min_value=0, max_value=50), min_size=0, max_size=4)

    def dumps(v):
        try:
            return json.dumps(v)
        except ValueError:          # an int over Python's digit limit: write its digits
            return str(v)

    @settings(max_examples=300, deadline=3000, suppress_health_check=list(HealthCheck), database=None)
    @given(which=st.sampled_from(["results", "samples", "line", "inspect"]), path=paths, value=_json_values(),
           raw=st.booleans())
    def case(which, path, value, raw):
        with tempfile.TemporaryDirectory(dir=base) as d:
            d = Path(d)
            if which == "inspect":
                f = d / log_json.name
                f.write_text(dumps(_mutate(log, path, value)) if not raw else dumps(value))
                call = lambda: import_inspect([d])  # noqa: E731
            else:
                rf = d / res0.name
                rf.write_text(dumps(_mutate(results, path, value)) if which == "results" else res0.read_text())
                for name, lines in samples.items():
                    if which == "samples" and name.startswith("samples_sr_bbq"):
                        rec = json.loads(lines[0])
                        lines = [dumps(_mutate(rec, path, value) if not raw else value), *lines[1:]]
                    elif which == "line" and name.startswith("samples_sr_twofilter"):
                        lines = [*lines[:1], dumps(value), *lines[2:]]
                    (d / name).write_text("\n".join(lines) + "\n")
                call = lambda: import_lmeval([d])  # noqa: E731
            try:
                call()
                seen[which, "ok"] += 1
            except DataError as exc:
                assert str(d) in str(exc)
                seen[which, "error"] += 1

    seen = collections.Counter()
    case()
    # every reader was hit, and both readable and refused inputs came up
    assert {w for w, _ in seen} == {"results", "samples", "line", "inspect"}
    assert {o for _, o in seen} == {"ok", "error"} and sum(seen.values()) >= 200, seen


def test_read_lmeval_then_certify(lmeval_runs):
    """read_lmeval on real lm-eval runs (two embedded models, with and without a system
    instruction: the session fixture of tests/lmeval_support.py) equals `import lm-eval`."""
    import safetyrepro
    from safetyrepro.crosspkg.importers import import_lmeval

    _, _, by_key = lmeval_runs
    runs = list(by_key.values())
    df = safetyrepro.read_lmeval(runs)
    ref = import_lmeval(runs)
    pd.testing.assert_frame_equal(df, ref.table)
    assert df.attrs["axes"] == ["system"] == ref.axes
    assert df.attrs["constant"]["package"].startswith("lm-eval ")
    assert df["model"].nunique() == 2 and len(df) == 2 * 2 * N_ITEMS
    one = safetyrepro.read_lmeval(str(runs[0]))  # one path, not a list
    assert one["model"].nunique() == 1 and len(one) == N_ITEMS
    res = safetyrepro.certify(df, config_cols=df.attrs["axes"], samples=50)
    assert res.level == "item" and int(res.pairs.iloc[0]["n_configs"]) == 2
