"""The CPU-testable parts of the vLLM comparison (safetyrepro.perf.vllm_compare,
benchmarks/gpu_vllm.py, benchmarks/gpu_check.sh): the local-folder config, vLLM's per-request
sampling parameters, the greedy-answer comparison with the task's parser, and (slow: loads the
embedded SmolLM2) the check's --dry-run end to end."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from safetyrepro.errors import ConfigError
from safetyrepro.inference import Stream
from safetyrepro.inference.sampling import item_seed
from safetyrepro.perf.vllm_compare import GroupRequests, compare_answers, local_model_config, sampling_params
from workflow_support import ROOT


def _req(items, prompts=None):
    streams = [Stream(0.0, 1.0, 0)] + [Stream(0.3, 1.0, s) for s in range(2)]
    prompts = prompts or [f"prompt {i}" for i in range(len(items))]
    return GroupRequests("truthfulqa", "T4-greedy-k5-freeform", [("greedy", 1), ("t0.3", 2)], items, prompts,
                         [[1, 2, 3]] * len(items), streams, 16, [7, 9], ["<|im_end|>"])


ITEMS = [{"item_id": f"truthfulqa/{i}", "question": "q", "choices": ["yes", "no", "maybe"], "gold": 0}
         for i in range(3)]


def test_sampling_params_per_item_and_stream():
    req = _req(ITEMS[:2])
    p = sampling_params(req)
    assert len(p) == 2 and all(len(row) == 3 for row in p)
    assert p[0][0]["temperature"] == 0.0 and p[0][1]["temperature"] == 0.3
    # the project's per-item seed derivation: cell seed and prompt text
    assert p[1][2]["seed"] == item_seed(1, "prompt 1") and p[0][1]["seed"] != p[1][1]["seed"]
    assert p[0][0]["stop_token_ids"] == [7, 9] and p[0][0]["stop"] == ["<|im_end|>"]
    assert p[0][0]["max_tokens"] == 16


def test_compare_answers_scores_with_the_task_parser():
    req = _req(ITEMS)
    a = [["Answer: A", "x", "x"], ["Answer: B", "x", "x"], ["A", "x", "x"]]
    b = [["The answer is (A).", "y", "y"], ["Answer: C", "y", "y"], ["A", "z", "z"]]
    got = compare_answers(req, a, b, ("one", "two"))
    assert got["n_items"] == 3 and got["stream"] == "greedy"
    assert got["answer_agreement"] == pytest.approx(2 / 3) and got["text_agreement"] == pytest.approx(1 / 3)
    assert got["differing_items"] == [{"item_id": "truthfulqa/1", "one": "B", "two": "C"}]
    assert got["score"] == {"one": pytest.approx(2 / 3), "two": pytest.approx(2 / 3)}
    with pytest.raises(ValueError, match="expected 3 items"):
        compare_answers(req, a[:2], b)


def test_local_model_config_points_models_at_folders(tmp_path):
    folder = tmp_path / "Qwen2.5-7B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    out = local_model_config(ROOT / "config" / "paper.yaml", {"qwen2.5-7b": str(folder)}, tmp_path / "c.yaml")
    cfg = yaml.safe_load(out.read_text())
    assert list(cfg["models"]) == ["qwen2.5-7b"]
    assert cfg["models"]["qwen2.5-7b"]["source"] == {"kind": "local", "path": str(folder.resolve())}
    assert cfg["models"]["qwen2.5-7b"]["quantization"] == "nf4"
    from safetyrepro.config import load_config

    assert load_config(out).model("qwen2.5-7b")["source"]["kind"] == "local"  # a valid run config
    with pytest.raises(ConfigError, match="models.nope"):
        local_model_config(ROOT / "config" / "paper.yaml", {"nope": str(folder)}, tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match="no config.json"):
        local_model_config(ROOT / "config" / "paper.yaml", {"qwen2.5-7b": str(tmp_path)}, tmp_path / "c.yaml")


def test_gpu_check_refuses_a_folder_without_config_json(tmp_path):
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", f"x={tmp_path}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no config.json" in r.stderr


@pytest.mark.slow  # loads the embedded SmolLM2 (prepared first) twice on the CPU
def test_gpu_check_dry_run_writes_both_records(gpu_check_dry_run):
    folder, path, out, r = gpu_check_dry_run
    assert r.returncode == 0, r.stdout + r.stderr
    smoke = json.loads((out / "gpu_smoke_cpu_mode.json").read_text())
    assert "error" not in smoke["models"]["smollm2-135m"] and smoke["measured_on_gpu"] is False
    rec = json.loads((out / "gpu_vllm_dry_run.json").read_text())
    m = rec["models"]["smollm2-135m"]
    assert rec["dry_run"] is True and "error" not in m
    assert m["requests"]["n_streams"] == 11 and m["requests"]["group"] == [["greedy", 1], ["t0.3", 5], ["t0.7", 5]]
    assert len(m["requests"]["sampling_params_first_item"]) == 11
    # fp32 greedy decoding is deterministic: the stand-in run agrees item by item
    c = m["comparison"]
    assert c["n_items"] == 2 and c["answer_agreement"] == 1.0 and c["text_agreement"] == 1.0
    assert m["engines"]["safetyrepro"]["wall_s"] > 0 and m["project_logprob_cell"]["wall_s"] > 0
