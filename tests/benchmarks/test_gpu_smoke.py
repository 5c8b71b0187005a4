"""benchmarks/gpu_smoke.py in its CPU mode on the smallest embedded model with tiny sizes: the
record has every section the GPU run fills, with numbers that mean what they say."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from safetyrepro.hashing import text_hash
from safetyrepro.models.chat import template_hash

pytestmark = pytest.mark.slow  # loads a model (the session fixture gpu_check_dry_run: ~35 s on 2 cores)



def test_gpu_smoke_cpu_mode_writes_a_complete_record(gpu_check_dry_run):
    # the record of gpu_smoke.py's CPU mode (--device cpu --quantization fp32 --items 2 --batch-size 2
    # --max-new-tokens 3 --oom-items 1 --profile-steps 2 --extrapolate-items 1), as run by
    # benchmarks/gpu_check.sh --dry-run (the session fixture of tests/conftest.py)
    folder, path, out, r = gpu_check_dry_run
    assert r.returncode == 0, r.stdout + r.stderr
    rec = json.loads((out / "gpu_smoke_cpu_mode.json").read_text())
    assert rec["measured_on_gpu"] is False and rec["environment"]["device"] == "cpu"
    m = rec["models"]["smollm2-135m"]
    assert "error" not in m
    tok = AutoTokenizer.from_pretrained(folder)
    assert m["load"]["chat_template_hash"] == template_hash(tok) and m["load"]["quantization"] == "fp32"
    p = m["t2_prompt"]
    assert p["prompt_sha256"] == text_hash(p["prompt"]) and p["cell"] == "T2-greedy-k3-freeform"
    assert p["stop_token_ids"] and len(p["stop_tokens"]) == len(p["stop_token_ids"])
    assert "<|im_start|>system\n" in p["prompt"]  # T2's role text in the system turn (ChatML)
    g = m["t4_k5_group"]
    assert g["group"] == [["greedy", 1], ["t0.3", 5], ["t0.7", 5]] and g["n_streams"] == 11
    assert g["n_sequences"] == 2 * 11 and 0 < g["generated_tokens"] <= 2 * 11 * 3
    assert g["decode_steps"] >= 1 and g["s_per_decode_step"] > 0 and g["prefill_forwards"] >= 1
    assert g["peak_rss_mib"] > 0
    assert m["oom_path"] == {"run": False, "reason": "no GPU: a memory fraction limits CUDA memory only"}
    shares = m["profile"]["shares_of_wall"]
    assert set(shares) == {"attention", "matmul", "other_ops", "idle"} and shares["matmul"] > 0
    x = m["extrapolated_paper_run"]
    # one benchmark: 4 templates x 3 shots, free-form decode groups and logprob cells
    assert x["groups"] == 24 and x["decode_s"] > 0 and x["prefill_s"] > 0
    # each part is rounded to 0.1 s on its own, so their sum is within 0.1 s of the total
    assert rec["extrapolated_paper_wall_s"] == x["total_s"]
    assert abs(x["total_s"] - (x["decode_s"] + x["prefill_s"])) <= 0.1 + 1e-9
