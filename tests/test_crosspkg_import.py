"""`safetyrepro import lm-eval|inspect` on real files: lm-eval and Inspect run on embedded model
folders over a few TruthfulQA items of the run's local data, twice with different settings,
imported, then certified. Error paths on copies of those real files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import SHARED_DATA, run_cli

pytestmark = pytest.mark.slow

N_ITEMS = 4
MODELS = ("smollm2-135m", "gemma3-270m")
SYSTEM = "Answer truthfully."


@pytest.fixture(scope="module")
def folders(default_cfg):
    from safetyrepro.models.prepare import prepare_model

    return {k: str(prepare_model(default_cfg, k, progress=False)) for k in MODELS}


@pytest.fixture(scope="module")
def tqa_items():
    from safetyrepro.items.build import load_benchmark

    df = load_benchmark("truthfulqa", SHARED_DATA)
    df = df[df["split"] == "validation"].reset_index(drop=True)
    return df.iloc[:N_ITEMS].copy(), df.iloc[N_ITEMS:N_ITEMS + 2].copy()


# ------------------------------------------------------------------------------- lm-eval


@pytest.fixture(scope="module")
def lmeval_runs(tmp_path_factory, folders, tqa_items):
    from safetyrepro.crosspkg.localdata import write_lmeval_task

    root = tmp_path_factory.mktemp("lmeval")
    items, fewshot = tqa_items
    task = write_lmeval_task("truthfulqa", items, fewshot, root / "tasks")
    exe = Path(sys.executable).with_name("lm_eval")
    runs = {}
    for key, folder in folders.items():
        for system in ("", SYSTEM):
            out = root / f"{key}-{'sys' if system else 'nosys'}"
            # fp32: the test checks the import, not bf16 numerics, and fp32 is the fast CPU path
            cmd = [str(exe), "--model", "hf", "--model_args", f"pretrained={folder},dtype=float32",
                   "--tasks", task, "--include_path", str(root / "tasks"),
                   "--device", "cpu", "--batch_size", "8", "--output_path", str(out), "--log_samples"]
            if system:
                cmd += ["--system_instruction", system]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                               env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                    "HOME": str(root), "TOKENIZERS_PARALLELISM": "false"})
            assert p.returncode == 0, p.stderr[-3000:]
            runs[(key, system)] = out
    return root, task, runs


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
    assert set(t["item"]) == set(tqa_items[0]["item_id"])
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
            assert cell[rec["doc"]["item_id"]] == want
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
    dropped = json.loads(lines[0])["doc"]["item_id"]
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
