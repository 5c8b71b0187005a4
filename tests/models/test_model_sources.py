"""Models are prepared before the cells: hub snapshots (pinned revision, verified, weights hash
recorded once), local folders (weights hash recorded once, not re-read at each worker start),
and failures at prepare time that name the model and what to do.

The Hugging Face hub is unreachable from this machine: the offline failure is the real one
(a real prepare run), the gated / unknown repository / unknown revision errors are the ones
huggingface_hub itself raises for the hub's documented error responses, and a verified snapshot
is a real model folder (SmolLM2) put where the download would have left it."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import safetyrepro.weights as weights
from safetyrepro.config import load_config
from safetyrepro.errors import ConfigError, ModelError
from safetyrepro.hashing import sha256_file
from safetyrepro.models import load_model, prepare_model
from safetyrepro.models.sources import hub
from workflow_support import ROOT
from config_support import config_copy

PAPER = ROOT / "config" / "paper.yaml"
QWEN = "qwen2.5-7b"


def _paper_copy(tmp_path: Path, **models_over) -> Path:
    cfg = config_copy(PAPER)
    cfg["runtime"].update(device="cpu", resources_dir=str(tmp_path / "resources"),
                          results_dir=str(tmp_path / "results"))
    for key, source in models_over.items():
        cfg["models"][key]["source"] = source
    path = tmp_path / "paper.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def smol_folder(default_cfg) -> Path:
    return Path(prepare_model(default_cfg, "smollm2-135m", progress=False))


def _link_model(src: Path, dest: Path) -> Path:
    """A model folder whose files are links to ``src``'s (no marker): a copy without the bytes."""
    dest.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != weights.MARKER:
            (dest / f.name).symlink_to(f)
    return dest


# ---- config ---------------------------------------------------------------------------------
def test_paper_hub_models_pin_a_revision(tmp_path):
    cfg = load_config(PAPER)
    for key in cfg.models:
        src = cfg.model(key)["source"]
        assert src["kind"] == "hub" and len(src["revision"]) == 40, key
    path = _paper_copy(tmp_path, **{QWEN: {"kind": "hub", "id": "Qwen/Qwen2.5-7B-Instruct"}})
    with pytest.raises(ConfigError, match=rf"models\.{QWEN}\.source"):
        load_config(path)
    path = _paper_copy(tmp_path, **{QWEN: {"kind": "hub", "id": "Qwen/Qwen2.5-7B-Instruct", "revision": "main"}})
    with pytest.raises(ConfigError, match=rf"models\.{QWEN}\.source"):
        load_config(path)


# ---- hub: failures at prepare time ----------------------------------------------------------
@pytest.mark.parametrize("offline_flag", [True, False])
def test_offline_machine_fails_at_prepare_naming_model_and_remedy(tmp_path, offline_flag):
    """The real prepare step (the workflow's rule command) on this machine, which cannot reach
    the hub: with HF_HUB_OFFLINE=1 and without it (the name does not resolve)."""
    path = _paper_copy(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_OFFLINE", None)
    if offline_flag:
        env["HF_HUB_OFFLINE"] = "1"
    r = subprocess.run([sys.executable, "-m", "safetyrepro", "prepare-model", "--config", str(path),
                        "--model", QWEN, "--marker", str(tmp_path / "m.json")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    rev = yaml.safe_load(PAPER.read_text())["models"][QWEN]["source"]["revision"]
    assert (f"error: model {QWEN} (hub repository Qwen/Qwen2.5-7B-Instruct at revision {rev}): cannot "
            "download it, the Hugging Face hub is not reachable") in r.stderr, r.stderr
    assert f"set models.{QWEN}.source to {{kind: local, path: DIR}}" in r.stderr
    assert not (tmp_path / "m.json").exists()
    assert not list((tmp_path / "resources").rglob(weights.MARKER))


def _hub_failure(code: int, error_code: str, message: str) -> Exception:
    """What huggingface_hub raises for the hub's error response (``X-Error-Code`` header)."""
    from huggingface_hub.utils import hf_raise_for_status

    try:
        httpx = importlib.import_module("httpx2")
    except ImportError:  # huggingface_hub < 2 uses httpx
        httpx = importlib.import_module("httpx")
    url = "https://huggingface.co/api/models/Qwen/Qwen2.5-7B-Instruct/revision/x"
    resp = httpx.Response(code, headers={"X-Error-Code": error_code, "X-Error-Message": message},
                          request=httpx.Request("GET", url))
    try:
        hf_raise_for_status(resp)
    except Exception as exc:  # noqa: BLE001
        return exc
    raise AssertionError("hf_raise_for_status raised nothing")


@pytest.mark.parametrize("code, error_code, needles", [
    (403, "GatedRepo", ["the repository is gated", "https://huggingface.co/Qwen/Qwen2.5-7B-Instruct",
                        "`hf auth login`", "HF_TOKEN"]),
    (404, "RevisionNotFound", ["has no revision", f"fix models.{QWEN}.source.revision"]),
    (401, "RepoNotFound", ["no such repository", f"check models.{QWEN}.source.id"]),
])
def test_hub_access_errors_name_the_model_and_the_remedy(code, error_code, needles):
    source = load_config(PAPER).model(QWEN)["source"]
    err = hub.hub_error(QWEN, source, _hub_failure(code, error_code, "refused"))
    assert isinstance(err, ModelError)
    assert str(err).startswith(f"model {QWEN} (hub repository {source['id']} at revision {source['revision']}): ")
    for n in needles:
        assert n in str(err), str(err)


# ---- hub: a verified snapshot loads without the network -------------------------------------
def test_verified_hub_snapshot_is_recorded_once_and_loads_offline(tmp_path, smol_folder, monkeypatch):
    source = {"kind": "hub", "id": "HuggingFaceTB/SmolLM2-135M-Instruct", "revision": "a" * 40}
    cfg_path = _paper_copy(tmp_path, **{QWEN: source})
    cfg = load_config(cfg_path)
    folder = hub.hub_dir(cfg.resources_dir, source)
    _link_model(smol_folder, folder)  # what snapshot_download leaves at local_dir
    shas = {f.name: sha256_file(f) for f in folder.glob("*.safetensors")}
    with pytest.raises(ModelError, match="sha256 mismatch: the hub records 0+ for"):
        hub.finish_hub_folder(folder, QWEN, source, {n: "0" * 64 for n in shas}, progress=False)
    with pytest.raises(ModelError, match="is not listed with a sha256 by the hub"):
        hub.finish_hub_folder(folder, QWEN, source, {}, progress=False)
    assert not (folder / weights.MARKER).exists()
    rec = hub.finish_hub_folder(folder, QWEN, source, shas, progress=False)
    assert rec["weights_hash"] == weights.read_marker(smol_folder)["weights_hash"]
    assert rec["files_sha256"] == shas and rec["revision"] == source["revision"]

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    calls = []
    real = weights.weights_hash
    monkeypatch.setattr(weights, "weights_hash", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert prepare_model(cfg, QWEN, progress=False) == folder  # marker: no download
    lm = load_model(cfg, QWEN, quantization="fp32", device="cpu")
    assert calls == []  # weights hash from the marker, not re-read
    assert lm.info["weights_hash"] == rec["weights_hash"] and lm.info["path"] == str(folder)
    assert lm.info["hub_id"] == source["id"] and lm.info["hub_revision"] == source["revision"]
    # another pinned revision is another snapshot: it would be downloaded (and fails offline)
    other = dict(source, revision="b" * 40)
    with pytest.raises(ModelError, match="hub is not reachable"):
        prepare_model(load_config(_paper_copy(tmp_path, **{QWEN: other})), QWEN, progress=False)


# ---- local folders --------------------------------------------------------------------------
def test_local_folder_loads_and_is_hashed_once(tmp_path, smol_folder, monkeypatch):
    local = _link_model(smol_folder, tmp_path / "my-model")
    cfg = load_config(_paper_copy(tmp_path, **{QWEN: {"kind": "local", "path": str(local)}}))
    calls = []
    real = weights.weights_hash
    monkeypatch.setattr(weights, "weights_hash", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert prepare_model(cfg, QWEN, progress=False) == local.resolve()
    assert len(calls) == 1  # recorded once, at preparation
    rec = json.loads(weights.local_record_path(cfg.resources_dir, local).read_text())
    assert rec["weights_hash"] == weights.read_marker(smol_folder)["weights_hash"]
    assert not (local / weights.MARKER).exists()  # the user's folder is left alone
    for _ in range(2):  # two worker starts
        lm = load_model(cfg, QWEN, quantization="fp32", device="cpu")
        assert lm.info["weights_hash"] == rec["weights_hash"] and lm.info["source_kind"] == "local"
    assert len(calls) == 1
    ids = lm.tokenizer("Hello", return_tensors="pt")["input_ids"]
    assert lm.model(ids).logits.shape[-1] == lm.model.config.vocab_size


def test_local_record_is_redone_when_a_weights_file_changes(tmp_path, monkeypatch):
    from safetensors.torch import save_file
    import torch

    folder = tmp_path / "tiny"
    folder.mkdir()
    save_file({"w": torch.zeros(4)}, folder / "model.safetensors")
    res = tmp_path / "resources"
    first = weights.record_local(res, "m", folder)
    calls = []
    real = weights.weights_hash
    monkeypatch.setattr(weights, "weights_hash", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert weights.recorded_weights_hash(res, folder) == first["weights_hash"] and calls == []
    save_file({"w": torch.ones(4)}, folder / "model.safetensors")  # same size, new bytes
    assert weights.recorded_weights_hash(res, folder) != first["weights_hash"] and len(calls) == 1


def test_missing_local_folder_fails_at_prepare_naming_the_field(tmp_path):
    cfg = load_config(_paper_copy(tmp_path, **{QWEN: {"kind": "local", "path": str(tmp_path / "nope")}}))
    with pytest.raises(ConfigError, match=rf"field 'models\.{QWEN}\.source\.path': model {QWEN}: folder "
                                          r".*nope does not exist; copy the model's HF folder"):
        prepare_model(cfg, QWEN, progress=False)
