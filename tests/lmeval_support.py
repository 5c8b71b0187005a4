"""Real lm-eval runs for the import tests, several in one Python process, and the session
fixtures of the real runs that tests/crosspkg/test_crosspkg_import.py and tests/test_api.py
both read (a pytest plugin of tests/conftest.py).

Each run is lm-eval's own console-script function (``lm_eval.__main__.cli_evaluate``) on its
own argument list, exactly what the ``lm_eval`` command runs; only the interpreter start, the
imports and the index of task YAMLs (lm-eval rebuilds it for every TaskManager: about 6.5 s
on 2 cores) are shared between the runs of one call.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


_DRIVER = """\
import json, sys
from lm_eval.__main__ import cli_evaluate
from lm_eval.tasks._index import TaskIndex

# the task index of the same folders (lm-eval's ~14k bundled task YAMLs and the include path)
# is built once for all runs of this process, not once per TaskManager
_build, _built = TaskIndex.build, {}
def _build_once(paths, *, resolve_includes=True):
    paths = list(paths)
    key = (tuple(map(str, paths)), resolve_includes)
    if key not in _built:
        _built[key] = _build(paths, resolve_includes=resolve_includes)
    return dict(_built[key])
TaskIndex.build = staticmethod(_build_once)
for argv in json.loads(sys.argv[1]):
    sys.argv = ["lm_eval", *argv]
    cli_evaluate()
print("safetyrepro-test: task index built", len(_built), "time(s)", file=sys.stderr)
"""


def run_lmeval(argvs: list[list[str]], env: dict, cwd: Path | None = None, timeout: int = 900):
    """Run ``lm_eval ARGV`` for every ARGV in ``argvs``, in order, in one subprocess with
    environment ``env``; returns the CompletedProcess (non-zero at the first failing run)."""
    return subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(argvs)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=cwd)


def hf_args(folder: str, tasks: str, include_path: Path, out: Path, system: str = "") -> list[str]:
    """``lm_eval`` arguments for a model folder on the CPU in fp32 (the tests check imports, not
    bf16 numerics, and fp32 is the fast CPU path), samples logged, with a system instruction
    if ``system`` is not empty."""
    return (["--model", "hf", "--model_args", f"pretrained={folder},dtype=float32", "--tasks", tasks,
             "--include_path", str(include_path), "--device", "cpu", "--batch_size", "8",
             "--output_path", str(out), "--log_samples"]
            + (["--system_instruction", system] if system else []))


N_ITEMS = 4
MODELS = ("smollm2-135m", "gemma3-270m")
SYSTEM = "Answer truthfully."
# lm-eval offline, with HOME (its datasets cache) set per fixture
LMEVAL_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
              "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="session")
def folders(default_cfg):
    from safetyrepro.models.prepare import prepare_model

    return {k: str(prepare_model(default_cfg, k, progress=False)) for k in MODELS}


@pytest.fixture(scope="session")
def tqa_items(shared_data):
    from safetyrepro.items.build import load_benchmark

    df = load_benchmark("truthfulqa", shared_data)
    df = df[df["split"] == "validation"].reset_index(drop=True)
    return df.iloc[:N_ITEMS].copy(), df.iloc[N_ITEMS:N_ITEMS + 2].copy()


@pytest.fixture(scope="session")
def lmeval_runs(tmp_path_factory, folders, tqa_items):
    from safetyrepro.crosspkg.localdata import write_lmeval_task

    root = tmp_path_factory.mktemp("lmeval")
    items, fewshot = tqa_items
    task = write_lmeval_task("truthfulqa", items, fewshot, root / "tasks")
    runs, argvs = {}, []
    for key, folder in folders.items():
        for system in ("", SYSTEM):
            out = root / f"{key}-{'sys' if system else 'nosys'}"
            argvs.append(hf_args(folder, task, root / "tasks", out, system))
            runs[(key, system)] = out
    p = run_lmeval(argvs, LMEVAL_ENV | {"HOME": str(root)}, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    return root, task, runs
