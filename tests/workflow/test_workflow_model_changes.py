"""What reruns when the generation batch size or a local model's weights change (real
Snakemake runs and dry runs on a copy of the project, real models): a batch-size change plans
the cells; a local folder whose weights were replaced (one tensor altered) prepares again and
reruns that model's cells and nothing else; a touched weights file with the same bytes reruns
nothing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from safetyrepro.config import load_config
from safetyrepro.io import read_parquet
from safetyrepro.models import prepare_model
from safetyrepro.weights import MARKER, weights_hash
from workflow_support import TINY, make_project_copy, planned, snakemake

pytestmark = pytest.mark.slow

CELL = "T1-greedy-k0-freeform"


def _local_copy(src: Path, dest: Path) -> Path:
    """A local model folder: the prepared SmolLM2 folder's files (weights copied, so the test
    may alter them; the rest linked)."""
    dest.mkdir(parents=True)
    for f in src.iterdir():
        if f.name == MARKER:
            continue
        if f.suffix == ".safetensors":
            shutil.copyfile(f, dest / f.name)
        else:
            (dest / f.name).symlink_to(f)
    return dest


def _alter_one_tensor(weights: Path) -> str:
    with safe_open(str(weights), framework="pt") as fh:
        metadata = fh.metadata()
    tensors = load_file(str(weights))
    name = "model.norm.weight" if "model.norm.weight" in tensors else sorted(tensors)[0]
    tensors[name] = tensors[name] * 1.5
    save_file(tensors, str(weights), metadata=metadata)
    return name


def test_batch_size_and_replaced_local_weights_rerun_exactly_their_cells(tmp_path):
    tiny = yaml.safe_load(TINY.read_text())
    smol = Path(prepare_model(load_config(TINY), "smol-fp32", progress=False))  # the checkout's resources
    local = _local_copy(smol, tmp_path / "loc-model")
    models = {"smol-fp32": tiny["models"]["smol-fp32"],
              "loc": {"display_name": "SmolLM2 from a local folder", "quantization": "fp32",
                      "source": {"kind": "local", "path": str(local)}}}
    project, config = make_project_copy(tmp_path / "p", {"models": models})
    # a resources folder of its own (the local folder's weights record goes there), holding
    # the checkout's prepared SmolLM2 (a link, no copy)
    resources = tmp_path / "resources"
    (resources / "models").mkdir(parents=True)
    (resources / "models" / smol.parent.name).symlink_to(smol.parent)
    cfg = yaml.safe_load(config.read_text())
    cfg["runtime"]["resources_dir"] = str(resources)
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    results = project / "results"
    shard = {m: results / "shards" / m / "xstest" / CELL / "s0.parquet" for m in models}
    targets = [str(p.relative_to(project)) for p in shard.values()]
    marker = {m: f"results/models/{m}.json" for m in models}

    r = snakemake(project, config, *targets)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    _, meta0 = read_parquet(shard["loc"])
    assert meta0["model_info"]["weights_hash"] == weights_hash(local)
    assert planned(project, config, *targets)[0] == {}

    # each target is the first cell of its decode group (greedy, t0.7 x 2 seeds), one job
    group = {m: {str((shard[m].parents[1] / c / f"s{k}.parquet").relative_to(project))
                 for c, k in ((CELL, 0), ("T1-t0.7-k0-freeform", 0), ("T1-t0.7-k0-freeform", 1))}
             for m in models}

    # -- generation.batch_size: both cells' groups (free-form batches of either model), nothing else
    cfg = yaml.safe_load(config.read_text())
    original = config.read_text()
    cfg["generation"]["batch_size"] = 2
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    counts, outs = planned(project, config, *targets)
    assert counts == {"cell_group_main": 2} and outs == group["smol-fp32"] | group["loc"]
    config.write_text(original)             # back: the recorded fingerprints hold again
    assert planned(project, config, *targets)[0] == {}

    # -- a touched weights file with the same bytes: read again at planning, nothing reruns
    weights = local / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    r = snakemake(project, config, "-n", *targets)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "model loc: hashing the weights" in r.stderr
    assert planned(project, config, *targets)[0] == {}

    # -- the local folder's weights replaced (one tensor altered): prepare and its cell only
    _alter_one_tensor(weights)
    new_hash = weights_hash(local)
    assert new_hash != meta0["model_info"]["weights_hash"]
    counts, outs = planned(project, config, *targets)
    assert counts == {"prepare_model": 1, "cell_group_main": 1}
    assert outs == {marker["loc"]} | group["loc"]
    smol_mtime = shard["smol-fp32"].stat().st_mtime_ns
    r = snakemake(project, config, *targets)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    _, meta1 = read_parquet(shard["loc"])
    assert meta1["model_info"]["weights_hash"] == new_hash and meta1["fingerprint"] != meta0["fingerprint"]
    assert shard["smol-fp32"].stat().st_mtime_ns == smol_mtime       # the other model's cell stays
    assert planned(project, config, *targets)[0] == {}
