"""No silent CPU fallback: a config that needs a GPU (runtime.device: cuda) fails before any
job starts on a machine where torch cannot use one, naming the field and the torch build."""

from __future__ import annotations

import pytest
import torch
import yaml

from safetyrepro.config import load_config
from safetyrepro.errors import ConfigError
from safetyrepro.models.load import require_device
from workflow_support import ROOT, TINY, make_project_copy, snakemake
from config_support import config_copy

HAS_CUDA = torch.cuda.is_available()


def test_paper_config_says_it_needs_a_gpu():
    assert load_config(ROOT / "config" / "paper.yaml").section("runtime")["device"] == "cuda"


def test_require_device(tmp_path):
    cfg = config_copy(TINY)
    cfg["runtime"]["device"] = "cuda"
    path = tmp_path / "cuda.yaml"
    path.write_text(yaml.safe_dump(cfg))
    if HAS_CUDA:
        assert require_device(load_config(path)) == "cuda"
    else:
        with pytest.raises(ConfigError, match=r"cuda\.yaml: field 'runtime\.device': 'cuda' is "
                                              r"required but .*torch " + torch.__version__.split("+")[0]):
            require_device(load_config(path))
    for dev in ("cpu", "auto"):
        cfg["runtime"]["device"] = dev
        path.write_text(yaml.safe_dump(cfg))
        assert require_device(load_config(path)) == dev


@pytest.mark.slow
def test_cuda_config_without_gpu_fails_before_any_job(tmp_path):
    if HAS_CUDA:  # the point is the machine without a GPU; with one, the check passes (above)
        return
    runtime = yaml.safe_load(TINY.read_text())["runtime"] | {"device": "cuda"}
    project, config = make_project_copy(tmp_path / "p", {"runtime": runtime})
    runtime["results_dir"] = str(project / "results")
    runtime["resources_dir"] = str(ROOT / "resources")
    cfg = yaml.safe_load(config.read_text())
    cfg["runtime"] = runtime
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    dry = snakemake(project, config, "-n")  # planning needs no GPU
    assert dry.returncode == 0, dry.stdout + dry.stderr
    r = snakemake(project, config, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "field 'runtime.device': 'cuda' is required but" in out, out
    # nothing ran: no job output, no job log
    made = [p for p in (project / "results").rglob("*") if p.is_file()] if (project / "results").exists() else []
    # the planner's cache of expected items content (Fingerprints.expected_items_content) is written
    # while planning and the results-folder lock at the start of the run, not by a job
    assert not [p for p in made if "run_summary" not in p.name
                and p.name not in (".expected_content.json", ".safetyrepro.lock")], made
