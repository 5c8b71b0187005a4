"""The real Snakemake workflow on the tiny config (SmolLM2 under fp32 and NF4 as two models,
2 benchmarks x 3 items, the tiny envelope): a full run, exact partial-rerun plans after edits,
and the reliability cases. Slow-ish (a few minutes): it runs real models."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from workflow_support import TINY, cell_rules, cli, make_project_copy, planned, snakemake

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    project, config = make_project_copy(tmp_path_factory.mktemp("tinyproj"))
    os.environ["SAFETYREPRO_PROGRESS_S"] = "2"   # the progress line every 2 s instead of 60
    try:
        r = snakemake(project, config)
    finally:
        del os.environ["SAFETYREPRO_PROGRESS_S"]
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    return project, config, r


def _shards(project: Path, root: str = "shards") -> list[Path]:
    return sorted((project / "results" / root).rglob("*.parquet"))


def test_full_run_outputs(tiny):
    project, config, r = tiny
    res = project / "results"
    cells = pq.read_table(res / "tables" / "cell_scores.parquet").to_pandas()
    assert len(cells) == 48  # 2 models x 2 benchmarks x 12 configs
    assert set(cells["model"]) == {"smol-fp32", "smol-nf4"}
    sampled = cells[cells["decoding"] == "t0.7"]
    assert (sampled["n_seeds"] == 2).all() and (cells[cells["decoding"] == "greedy"]["n_seeds"] == 1).all()
    assert cells["score"].between(0, 1).all()
    assert (cells["score"] == cells["score_num"] / cells["score_den"]).all()
    assert (cells["score_den"] == cells["n_items"] * cells["n_seeds"]).all()
    meta = json.loads(pq.read_schema(res / "tables" / "cell_scores.parquet").metadata[b"safetyrepro"])
    assert meta["rules_stamp"] == cells["rules_stamp"].iloc[0] and meta["n_shards"] == 64
    rho = pq.read_table(res / "tables" / "rho_flip.parquet").to_pandas()
    assert len(rho) == 2 and set(rho["benchmark"]) == {"truthfulqa", "xstest"}
    assert (rho["rho_flip"] <= rho["ceiling"]).all()
    sig = pq.read_table(res / "tables" / "significance.parquet").to_pandas()
    assert len(sig) == 2 and (sig["rho_flip"].to_numpy() == rho.sort_values("benchmark")["rho_flip"].to_numpy()).all()
    assert "Significance-aware verdicts" in (res / "report.md").read_text()
    for f in ("report.md", "cards/index.json", "figures/rho_heatmap.png", "tables/precision.parquet",
              "figures/rho_significance.png", "tables/bootstrap_items.parquet", "tables/significance_configs.parquet",
              "tables/table2.parquet", "tables/anova.parquet", "tables/robustness.parquet"):
        assert (res / f).exists(), f
    assert len(_shards(project)) == 64 and len(_shards(project, "shards_bf16")) == 8
    # model loads are counted and printed; each worker key loads once in this run
    summary = json.loads((res / "logs" / "run_summary.json").read_text())
    assert summary["max_loads_per_key"] == 1
    assert "model loads" in r.stdout + r.stderr
    assert "job rate limiter off for local execution" in r.stdout + r.stderr
    # the workers compute on every core, not on the one thread Snakemake allows each job
    info = json.loads(pq.read_schema(_shards(project)[0]).metadata[b"safetyrepro"])["model_info"]
    assert info["threads"] == len(os.sched_getaffinity(0))
    # every shard names the dtype its model computed in; fp32 models compute in float32
    infos = [json.loads(pq.read_schema(p).metadata[b"safetyrepro"])["model_info"] for p in _shards(project)]
    assert {i["compute_dtype"] for i in infos if i["quantization"] == "fp32"} == {"float32"}
    assert {i["compute_dtype"] for i in infos} <= {"float32", "bfloat16"}
    # the run printed its progress with a time-left estimate from the cells done so far
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("[progress] cells ")]
    assert lines and any("of cells left (from the" in ln for ln in lines), lines


def test_html_report(tiny):
    project, config, _ = tiny
    out = project / "results" / "report.html"
    r = snakemake(project, config, "--report", str(out))
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    html = out.read_text(errors="replace")
    for name in ("rho_heatmap.png", "orderings.png", "anova_shares.png", "shap_summary.png",
                 "consistency.png", "table2.csv", "anova.csv", "index.json"):
        assert name in html, name


def test_rerun_does_nothing(tiny):
    project, config, _ = tiny
    counts, _ = planned(project, config)
    assert counts == {}


def _edit(path: Path, old: str, new: str) -> str:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))
    return text


def test_parser_change_reruns_scoring_only(tiny):
    project, config, _ = tiny
    f = project / "src" / "safetyrepro" / "parsing" / "choice.py"
    original = f.read_text()
    try:
        f.write_text(original + "\n# a parser fix\n")
        counts, _ = planned(project, config)
    finally:
        f.write_text(original)
    assert not cell_rules(counts), counts
    assert {"aggregate", "aggregate_bf16", "rho_flip", "paper_tables"} <= set(counts)


def _plan_after_yaml_edit(project, config, path, edit):
    """Dry-run plan after editing a YAML file (restored afterwards): (job counts, planned shards)."""
    original = path.read_text()
    data = yaml.safe_load(original)
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        counts, outputs = planned(project, config)
    finally:
        path.write_text(original)
    return counts, {o for o in outputs if "/shards" in o}


def _existing_shards(project, needle):
    return {str(p.relative_to(project)) for p in _shards(project) if needle in str(p)}


def test_template_change_reruns_exactly_its_cells(tiny):
    project, config, _ = tiny
    f = project / "src" / "safetyrepro" / "tasks" / "truthfulqa.yaml"

    def edit(task):  # edit T4's text only
        task["templates"]["T4"]["freeform"]["user"] += " Think it through."

    counts, shards = _plan_after_yaml_edit(project, config, f, edit)
    expected = _existing_shards(project, "/truthfulqa/T4-")
    assert expected and shards == expected
    assert "items" not in counts and "prepare_model" not in counts


def test_quantization_change_reruns_that_models_cells_only(tiny):
    project, config, _ = tiny

    def edit(cfg):
        cfg["models"]["smol-nf4"]["quantization"] = "bf16"

    counts, shards = _plan_after_yaml_edit(project, config, config, edit)
    assert shards == _existing_shards(project, "/smol-nf4/")
    # its logprob and bf16 cells one job each, its free-form cells one job per decode group
    assert set(cell_rules(counts)) == {"cell", "cell_group_main"}


def test_rules_bump_reruns_every_cell(tiny):
    project, config, _ = tiny
    f = project / "tests" / "configs" / "envelope_tiny.yaml"
    original = _edit(f, "rules_version: 1", "rules_version: 2")
    try:
        counts, shards = planned(project, config)
    finally:
        f.write_text(original)
    assert len({o for o in shards if "/shards" in o}) == 64 + 8
    # 48 free-form cells in 16 decode groups (greedy + 2 seeds of t0.7), 16 logprob and 8 bf16 cells
    assert cell_rules(counts) == {"cell_group_main": 16, "cell": 16 + 8}


def test_aggregation_refuses_mixed_rules_stamps(tiny, tmp_path):
    from safetyrepro.io import read_parquet, write_parquet

    project, config, _ = tiny
    shard = _shards(project)[0]
    backup = tmp_path / "backup.parquet"
    backup.write_bytes(shard.read_bytes())
    table, meta = read_parquet(shard)
    try:
        write_parquet(table, shard, dict(meta, rules_stamp="0" * 64))
        r = cli(project, "aggregate", "--config", str(config), "--out-dir", str(tmp_path / "t"))
        assert r.returncode == 2
        assert "different rules stamps" in r.stderr and str(shard) in r.stderr
        assert not (tmp_path / "t" / "cell_scores.parquet").exists()
    finally:
        shard.write_bytes(backup.read_bytes())


def test_corrupt_shard_is_named(tiny, tmp_path):
    from safetyrepro.shards import read_shard
    from safetyrepro.errors import ShardError

    project, config, _ = tiny
    shard = _shards(project)[1]
    bad = tmp_path / "truncated.parquet"
    bad.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(ShardError, match="truncated.parquet"):
        read_shard(bad)
    backup = shard.read_bytes()
    try:
        shard.write_bytes(backup[:100])
        r = cli(project, "aggregate", "--config", str(config), "--out-dir", str(tmp_path / "t"))
        assert r.returncode == 2 and str(shard) in r.stderr and "not a readable Parquet file" in r.stderr
    finally:
        shard.write_bytes(backup)


def test_a_flipped_bit_in_a_shard_is_caught_and_only_its_cell_reruns(tiny):
    """A bit flipped inside a shard's data page: the aggregation job fails naming the shard and
    moves it aside (``.corrupt``; Snakemake removes the failed job's outputs), and the next
    run's plan recomputes exactly that cell's job (then aggregation and what follows): the
    cell itself (a logprob cell), or its decode group (a free-form cell)."""
    project, config, _ = tiny
    shard = _shards(project)[2]
    assert shard.parent.name == "T1-greedy-k3-freeform", shard   # a decode group's first cell
    group = {shard} | {shard.parents[1] / "T1-t0.7-k3-freeform" / f"s{s}.parquet" for s in (0, 1)}
    corrupt = shard.with_name(shard.name + ".corrupt")
    tables = project / "results" / "tables"
    saved = {p: (p.read_bytes(), p.stat()) for p in [shard, *tables.iterdir()] if p.is_file()}
    col = pq.ParquetFile(shard).metadata.row_group(0).column(3)       # raw_output
    data = bytearray(saved[shard][0])
    data[(col.dictionary_page_offset or col.data_page_offset) + col.total_compressed_size - 2] ^= 0x10
    try:
        shard.write_bytes(bytes(data))
        r = snakemake(project, config, "results/tables/cell_scores.parquet", "--forcerun", "aggregate")
        out = r.stdout + r.stderr
        assert r.returncode != 0 and f"{shard}: corrupt Parquet data" in out
        assert "so that the next run recomputes it" in out
        assert not shard.exists() and corrupt.read_bytes() == bytes(data)
        counts, outputs = planned(project, config)
        assert {o for o in outputs if "/shards" in o} == {str(p.relative_to(project)) for p in group}
        assert cell_rules(counts) == {"cell_group_main": 1} and counts["aggregate"] == 1
        # a logprob cell: its own job
        logprob = shard.parents[1] / "T1-greedy-k3-logprob" / "s0.parquet"
        os.replace(logprob, corrupt.with_name("logprob.aside"))
        try:
            counts, outputs = planned(project, config)
        finally:
            os.replace(corrupt.with_name("logprob.aside"), logprob)
        assert {o for o in outputs if "/shards" in o} == {str(p.relative_to(project)) for p in group | {logprob}}
        assert cell_rules(counts) == {"cell_group_main": 1, "cell": 1}
    finally:
        for p, (b, st) in saved.items():
            p.write_bytes(b)
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
        corrupt.unlink(missing_ok=True)


def test_malformed_config_fails_before_any_job(tmp_path):
    project, config = make_project_copy(tmp_path / "p")
    cfg = yaml.safe_load(config.read_text())
    cfg["benchmarks"]["xstest"]["n_items"] = 0
    config.write_text(yaml.safe_dump(cfg))
    r = snakemake(project, config)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert str(config) in out and "benchmarks.xstest.n_items" in out
    assert not (project / "results").exists()


def test_missing_model_fails_only_its_jobs(tmp_path):
    project, config = make_project_copy(tmp_path / "p")
    cfg = yaml.safe_load(config.read_text())
    cfg["models"]["ghost"] = {"display_name": "missing", "quantization": "fp32",
                              "source": {"kind": "local", "path": str(tmp_path / "no-such-model")}}
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    good = "results/shards/smol-fp32/xstest/T1-greedy-k0-logprob/s0.parquet"
    bad = "results/shards/ghost/xstest/T1-greedy-k0-logprob/s0.parquet"
    r = snakemake(project, config, "--keep-going", good, bad)  # relative targets, as a user types them
    assert r.returncode != 0
    assert (project / good).exists() and not (project / bad).exists()
    log = (project / "results" / "logs" / "prepare_model" / "ghost.log").read_text()
    assert "models.ghost.source.path" in log and "no-such-model" in log
    out = r.stdout + r.stderr
    # the end of the run lists the failed job with the error line of its log
    summary = out[out.index("failed jobs (1):"):]
    assert "prepare_model: results/models/ghost.json" in summary and "models.ghost.source.path" in summary


def test_killed_run_resumes_without_loss(tmp_path):
    from safetyrepro.shards import read_shard

    # one of the tiny config's two models (32 cells): a kill and a resume need no second model
    models = yaml.safe_load(TINY.read_text())["models"]
    project, config = make_project_copy(tmp_path / "p", {"models": {"smol-fp32": models["smol-fp32"]}})
    target = ["results/tables/cell_scores.parquet"]
    proc = snakemake(project, config, *target, popen=True)
    shards = project / "results" / "shards"
    deadline = time.time() + 600
    while time.time() < deadline and len(list(shards.rglob("*.parquet"))) < 5:
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)  # snakemake and its cell client, mid-run
    proc.wait()
    n_before = len(list(shards.rglob("*.parquet")))
    assert 5 <= n_before < 32
    # what a user does after a crash or kill: release Snakemake's lock, then run again
    assert snakemake(project, config, "--unlock").returncode == 0
    r = snakemake(project, config, *target)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    files = sorted(shards.rglob("*.parquet"))
    assert len(files) == 32 and {f.relative_to(shards).parts[0] for f in files} == {"smol-fp32"}
    for f in files:
        table, meta = read_shard(f)
        assert table.num_rows == 3 and len(set(table.column("item_id").to_pylist())) == 3
    assert not list(shards.rglob("*.tmp"))
    from safetyrepro.worker.lifecycle import stop_workers
    from safetyrepro.worker.layout import default_state_dir

    stop_workers(default_state_dir(project / "results"))
