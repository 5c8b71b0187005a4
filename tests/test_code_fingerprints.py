"""Code fingerprints (provenance.code_fingerprint): which source files compute an output,
the stamp every table records, and the STALE marking of a table written by other code. The
real Snakemake reruns are in tests/workflow/test_workflow_code_fingerprints.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from analysis_synth import hand_cells, hand_meta, provenance_for, write_hand
from safetyrepro.analysis.cards import write_cards
from safetyrepro.analysis.figures import write_figures
from safetyrepro.analysis.report_md import build_report
from safetyrepro.analysis.tables import write_paper_tables
from safetyrepro.io import DIGEST_KEY, META_KEY, read_metadata
from safetyrepro.provenance import code_files, code_fingerprint, stale_reason

ROOT = Path(__file__).resolve().parents[1]


def test_code_files_follow_imports_including_lazy_ones():
    tables = code_files("safetyrepro.analysis.tables")
    # metrics through `from ..metrics import`, certify through an import inside a function
    assert {"analysis/tables.py", "analysis/common.py", "metrics/flips.py", "metrics/tables.py",
            "certify.py", "analysis/__init__.py", "__init__.py"} <= set(tables)
    # not what the paper tables never import
    assert not {"analysis/variance.py", "analysis/robustness.py", "parsing/choice.py"} & set(tables)
    assert not any(f.startswith(("inference/", "models/", "worker/")) for f in tables)
    # a package whose code is read brings its data files (the task YAMLs the parsers read)
    agg = code_files("safetyrepro.aggregate")
    assert {"aggregate.py", "parsing/choice.py", "tasks/task.py", "tasks/truthfulqa.yaml"} <= set(agg)
    assert "analysis/variance.py" in code_files("safetyrepro.analysis.variance")
    assert code_fingerprint("safetyrepro.analysis.tables") != code_fingerprint("safetyrepro.analysis.variance")
    with pytest.raises(ValueError, match="safetyrepro.nope"):
        code_files("safetyrepro.nope")


def test_every_table_rule_is_fingerprinted_by_its_code():
    """Each rule that writes a table, card, figure or the report passes the fingerprint of
    the module its command runs, and that module is the one the output is stamped with."""
    rules = {}
    for f in ("aggregate.smk", "analysis.smk", "report.smk"):
        for block in re.split(r"(?m)^(?=rule )", (ROOT / "workflow" / "rules" / f).read_text()):
            m = re.match(r"rule (\w+):", block)
            if m:
                rules[m.group(1)] = block
    assert len(rules) >= 11
    # `safetyrepro analyze <command>` -> the module that command imports its writer from
    cli = (ROOT / "src" / "safetyrepro" / "analysis" / "cli.py").read_text()
    command_module = {m.group(1): f"safetyrepro.analysis.{m.group(2)}" for m in re.finditer(
        r'@analyze\.command\("([\w-]+)"\)(?:(?!@analyze).)*?from \.(\w+) import', cli, flags=re.S)}
    assert len(command_module) >= 8
    for name, block in rules.items():
        fp = re.search(r'code=PLAN\.fingerprints\.code_fingerprint\("(safetyrepro[\w.]+)"\)', block)
        assert fp or "scoring=PLAN.fingerprints.scoring_code" in block, f"rule {name} has no code fingerprint in its params"
        cmd = re.search(r"-m safetyrepro analyze ([\w-]+)", block)
        if cmd:
            assert fp.group(1) == command_module[cmd.group(1)], name
        elif "-m safetyrepro rho-flip" in block:
            assert fp.group(1) == "safetyrepro.metrics.tables"


def _write_tables(tmp_path):
    src = write_hand(hand_cells([(m, "bbq", c, s) for c, ss in {
        "T1-greedy-k0-freeform": (0.8, 0.6), "T2-greedy-k0-freeform": (0.5, 0.7),
        "T1-greedy-k3-freeform": (0.6, 0.6)}.items() for m, s in zip("AB", ss)]), tmp_path / "cs.parquet")
    return src, write_paper_tables(src, tmp_path / "tables", bootstrap_samples=10)


def _rewrite_meta(path, **changes):
    t = pq.read_table(path)
    md = json.loads(t.schema.metadata[META_KEY])
    md.update(changes)
    md = {k: v for k, v in md.items() if v is not None}
    # as a table from before content digests (a digest would refuse the edited metadata)
    kept = {k: v for k, v in t.schema.metadata.items() if k != DIGEST_KEY}
    pq.write_table(t.replace_schema_metadata({**kept, META_KEY: json.dumps(md).encode()}), path)


def test_tables_carry_their_code_stamp_and_old_ones_are_stale(tmp_path):
    src, paths = _write_tables(tmp_path)
    md = read_metadata(paths["table2"])
    assert md["producer"] == "safetyrepro.analysis.tables"
    assert md["code_fingerprint"] == code_fingerprint("safetyrepro.analysis.tables")
    assert stale_reason(md) is None  # a hand-made source without a code stamp is not checked

    old = "0" * 64
    assert "safetyrepro.analysis.tables at code fingerprint 000000000000" in stale_reason(
        {**md, "code_fingerprint": old})
    assert "no code fingerprint" in stale_reason({k: v for k, v in md.items() if k != "code_fingerprint"})
    # a stamped source written by other aggregation code makes the table stale too
    src_rec = {"path": "cs.parquet", "producer": "safetyrepro.aggregate", "code_fingerprint": old}
    assert stale_reason({**md, "sources": [src_rec]}).startswith("source cs.parquet: written by safetyrepro.aggregate")
    src_rec["code_fingerprint"] = code_fingerprint("safetyrepro.aggregate")
    assert stale_reason({**md, "sources": [src_rec]}) is None

    # the report marks exactly the table written by other code
    report = build_report(tmp_path / "tables", tmp_path / "figures", tmp_path / "report.md")
    assert "STALE" not in report and "every table was computed by the current code" in report
    _rewrite_meta(paths["table4"], code_fingerprint=old)
    _rewrite_meta(paths["tau_r"], producer=None, code_fingerprint=None)  # from before stamping
    report = build_report(tmp_path / "tables", tmp_path / "figures", tmp_path / "report.md")
    assert "**STALE tables (2): table4, tau_r**" in report
    assert "**STALE: `table4` is not from the current code (written by safetyrepro.analysis.tables" in report
    assert "**STALE: `tau_r` is not from the current code (no code fingerprint" in report
    assert "STALE: `table2`" not in report


def test_cards_mark_cell_scores_from_other_aggregation_code(tmp_path):
    cells = hand_cells([(m, "bbq", "T1-greedy-k0-freeform", s) for m, s in zip("AB", (0.6, 0.4))])
    prov = tmp_path / "prov.json"
    prov.write_text(json.dumps(provenance_for(cells)))
    current = {"producer": "safetyrepro.aggregate", "code_fingerprint": code_fingerprint("safetyrepro.aggregate")}
    for stamp, stale in ((current, False), ({**current, "code_fingerprint": "f" * 64}, True)):
        src = write_hand(cells, tmp_path / "cs.parquet", {**hand_meta(), **stamp})
        paths = write_cards(src, prov, tmp_path / "cards")
        index = json.loads(paths["index"].read_text())
        assert index["producer"] == "safetyrepro.analysis.cards" and index["sources"][0]["producer"] == stamp["producer"]
        assert (index["stale"] is not None) == stale
        assert ("**STALE: `cs.parquet` is not from the current code" in paths["A__bbq.md"].read_text()) == stale
        assert (json.loads(paths["A__bbq.json"].read_text())["stale"] is not None) == stale


def test_a_figure_from_an_old_table_says_stale(tmp_path):
    from PIL import Image

    _, paths = _write_tables(tmp_path)
    for old, stale in ((None, False), ("0" * 64, True)):
        if old:
            _rewrite_meta(paths["table4"], code_fingerprint=old)
        png = write_figures(tmp_path / "tables", tmp_path / "figures", which=["orderings"])["orderings"]
        with Image.open(png) as im:
            stamp = json.loads(im.text["Description"])
        assert stamp["producer"] == "safetyrepro.analysis.figures"
        assert stamp["sources"][0]["producer"] == "safetyrepro.analysis.tables"
        assert (stamp["stale"] is not None) == stale
        assert (stale_reason(stamp) is not None) == stale
