"""GRID cards: one disclosure card per (model, benchmark), as JSON and Markdown.

A card states what is needed to reproduce or judge a reported score: the model and its
numerics, envelope, item subset, stamps, score range, rho_flip and Prop. 1's verdict against
every other model, plus the tables given (significance, nearest reversal, precision check,
cross-package, scale probe). Provenance comes from the run: ``{model: {benchmark: record}}``,
``{(model, benchmark): record}`` or a JSON/YAML file with the nested form.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, TypedDict

import numpy as np
import pandas as pd
import yaml

from ..errors import ConfigError, DataError
from ..sysutil import atomic_write_text
from ..metrics import pairwise_table
from ..provenance import code_stamp, code_version_string
from .common import (check_same_rules, load_cell_scores, read_table, source_record, source_stale_note,
                     version_text)
from .outputs import CARDS_INDEX, card_stem, table_outputs
from .scale_probe import probe_line

CARD_VERSION = 5  # 3: chat template hash, numerics and batch plans disclosed; 4: precision check;
#                   5: the cross-package rows name their arithmetic (compute)


class Provenance(TypedDict):
    model_id: str
    weights_hash: str
    quantization: str
    device: str
    template_hashes: dict[str, str]   # template level id -> sha256 of its text
    parser_version: str
    subset_hash: str
    item_ids_path: str
    code_version: str


PROVENANCE_FIELDS = tuple(Provenance.__annotations__)
# Recorded by SafetyRepro's own aggregation; a provenance file written elsewhere may lack them,
# and its card then says "not recorded" instead of leaving the row out.
OPTIONAL_PROVENANCE_FIELDS = ("chat_template_hash", "numerics", "batching")


def load_provenance(source: Mapping | str | Path) -> dict[tuple[str, str], dict]:
    """Normalise the provenance input to {(model, benchmark): record}, checking the fields."""
    where: str = "provenance"
    if isinstance(source, (str, Path)):
        where = str(source)
        path = Path(source)
        if not path.exists():
            raise ConfigError(path, None, "provenance file not found")
        source = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(source, Mapping):
        raise ConfigError(where, None, "expected a mapping {model: {benchmark: record}}")
    out: dict[tuple[str, str], dict] = {}
    for key, val in source.items():
        if isinstance(key, tuple):
            out[(str(key[0]), str(key[1]))] = val
        elif isinstance(val, Mapping):
            for b, rec in val.items():
                out[(str(key), str(b))] = rec
        else:
            raise ConfigError(where, str(key), "expected a mapping benchmark -> record")
    for (m, b), rec in out.items():
        if not isinstance(rec, Mapping):
            raise ConfigError(where, f"{m}.{b}", "expected a provenance record (mapping)")
        missing = [f for f in PROVENANCE_FIELDS if f not in rec]
        if missing:
            raise ConfigError(where, f"{m}.{b}", f"missing field(s) {missing}")
        if not isinstance(rec["template_hashes"], Mapping):
            raise ConfigError(where, f"{m}.{b}.template_hashes", "expected a mapping template id -> hash")
    return out


def verdict(model: str, other: str, n_plus: int, n_minus: int, n_zero: int, rho: float) -> str:
    """Prop. 1's verdict for ``model`` vs ``other`` in words (n_plus: configs where model is ahead)."""
    if n_plus and n_minus:
        return (f"flips: {model} ahead in {n_plus}, behind in {n_minus}, tied in {n_zero} configs "
                f"(rho_flip = {rho:.3f}; D1 fails)")
    if not n_plus and not n_minus:
        return f"tied with {other} in every config (D2, hence D1)"
    word = "ahead of" if n_plus else "behind"
    if n_zero:
        return f"stable: {model} {word} or tied with {other} in every config (D1, not D2; rho_flip = 0)"
    return f"stable: {model} {word} {other} in every config (D2, hence D1; rho_flip = 0)"


def _levels(sub: pd.DataFrame, axis: str) -> list[str]:
    return sorted(sub[axis].astype(str).unique())


def _reversal_entry(rev: pd.DataFrame | None, benchmark: str, model: str, other: str) -> dict | None:
    if rev is None:
        return None
    a, b = sorted((model, other))
    r = rev[(rev["benchmark"] == benchmark) & (rev["model_a"] == a) & (rev["model_b"] == b)]
    if len(r) != 1:
        raise DataError("nearest_reversal", f"no row for ({benchmark}, {a} vs {b})")
    r = r.iloc[0]
    dist = lambda v: None if pd.isna(v) else int(v)  # noqa: E731
    return {"nominal_config": r["nominal_config"], "reference_config": r["nominal_used"],
            "leader_at_reference": r["nominal_leader"], "strict_distance": dist(r["strict_distance"]),
            "strict": r["strict_result"], "significant_distance": dist(r["sig_distance"]),
            "significant": r["sig_result"], "note": r["note"]}


PATTERN_WORDS = {
    "stable": "no strict reversal",
    "noise": "reversals all within item noise",
    "one_sided": "significant in one direction only",
    "crossover": "significant reversals both ways",
}


def _significance(sig: pd.DataFrame | None, model: str, other: str, benchmark: str, first: bool) -> dict:
    if sig is None:
        return {"significance": None}
    a, b = (model, other) if first else (other, model)
    r = sig[(sig["benchmark"] == benchmark) & (sig["model_a"] == a) & (sig["model_b"] == b)]
    if r.empty:
        raise DataError("significance", f"no row for ({benchmark}, {a} vs {b})")
    r = r.iloc[0]
    ahead, behind = (r["n_plus_sig"], r["n_minus_sig"]) if first else (r["n_minus_sig"], r["n_plus_sig"])
    return {"significance": {
        "n_ahead_sig": int(ahead), "n_behind_sig": int(behind), "rho_flip_sig": float(r["rho_flip_sig"]),
        "alpha": float(r["alpha"]), "correction": str(r["correction"]),
        "crossover_p": float(r["crossover_p"]), "crossover": bool(r["crossover"]),
        "rho_flip_null_mean": float(r["rho_flip_null_mean"]), "rho_flip_null_q95": float(r["rho_flip_null_q95"]),
        "rho_flip_null_p": float(r["rho_flip_null_p"]), "flips_exceed_noise": bool(r["flips_exceed_noise"]),
        "mdd_median": float(r["mdd_median"]), "can_reach_alpha": bool(r["can_reach_alpha"]),
        "n_items": int(r["n_items"]), "family": str(r["family"]),
        "pattern": str(r["pattern"]), "pattern_text": PATTERN_WORDS.get(str(r["pattern"]), str(r["pattern"]))}}


def build_card(model: str, benchmark: str, cells: pd.DataFrame, pairs: pd.DataFrame,
               prov: Mapping, meta: dict, sig: pd.DataFrame | None = None,
               reversal: pd.DataFrame | None = None) -> dict:
    sub = cells[(cells["model"] == model) & (cells["benchmark"] == benchmark)]
    if sub.empty:
        raise DataError("cell_scores", f"no cells for ({model}, {benchmark})")
    templates = _levels(sub, "template")
    missing = [t for t in templates if t not in prov["template_hashes"]]
    if missing:
        raise ConfigError("provenance", f"{model}.{benchmark}.template_hashes",
                          f"no text hash for template(s) {missing} used in the envelope")
    if "quantization" in sub:
        q = set(sub["quantization"].astype(str))
        if q != {str(prov["quantization"])}:
            raise DataError("cell_scores", f"({model}, {benchmark}): quantization {sorted(q)} in the cells "
                                           f"but {prov['quantization']!r} in the provenance")
    if "subset_hash" in sub:
        sh = set(sub["subset_hash"].astype(str))
        if sh != {str(prov["subset_hash"])}:
            raise DataError("cell_scores", f"({model}, {benchmark}): subset_hash {sorted(sh)} in the cells "
                                           f"but {prov['subset_hash']!r} in the provenance")
    s = sub.set_index("config")["score"]
    comps = []
    pb = pairs[(pairs["benchmark"] == benchmark) & ((pairs["model_a"] == model) | (pairs["model_b"] == model))]
    for r in pb.itertuples():
        first = r.model_a == model
        other = r.model_b if first else r.model_a
        n_plus, n_minus = (r.n_plus, r.n_minus) if first else (r.n_minus, r.n_plus)
        comps.append({"other": other, "n_ahead": int(n_plus), "n_behind": int(n_minus),
                      "n_tied": int(r.n_zero), "n_configs": int(r.n_configs), "rho_flip": float(r.rho_flip),
                      "ceiling": float(r.ceiling), "saturated": bool(r.saturated), "d1": bool(r.d1),
                      "d2": bool(r.d2), "verdict": verdict(model, other, int(n_plus), int(n_minus),
                                                            int(r.n_zero), float(r.rho_flip)),
                      **_significance(sig, model, other, benchmark, first),
                      "nearest_reversal": _reversal_entry(reversal, benchmark, model, other)})
    comps.sort(key=lambda c: c["other"])
    n_items = sorted(int(x) for x in sub["n_items"].unique()) if "n_items" in sub else []
    return {
        "card_version": CARD_VERSION,
        "model": model, "benchmark": benchmark,
        "model_id": prov["model_id"], "weights_hash": prov["weights_hash"],
        "quantization": prov["quantization"], "device": prov["device"],
        **{f: prov.get(f) for f in OPTIONAL_PROVENANCE_FIELDS},
        "templates": [{"id": t, "text_hash": prov["template_hashes"][t]} for t in templates],
        "decodings": _levels(sub, "decoding"), "shots": _levels(sub, "shots"),
        "scoring_paths": _levels(sub, "scoring"), "parser_version": prov["parser_version"],
        "items": {"subset_hash": prov["subset_hash"], "item_ids_path": prov["item_ids_path"],
                  "n_items": n_items},
        "rules_stamp": meta["rules_stamp"], "config_hash": meta["config_hash"],
        "code_version": {"run": prov["code_version"], "cell_scores": meta["code_version"],
                         "analysis": code_version_string()},
        "envelope": {"n_configs": int(len(s)), "score_min": float(s.min()), "score_max": float(s.max()),
                     "score_range": float(s.max() - s.min()), "score_median": float(s.median()),
                     "config_min": str(s.idxmin()), "config_max": str(s.idxmax())},
        "comparisons": comps,
    }


def _chat_template_text(h) -> str:
    if h is None:
        return "not recorded"
    return f"`{h}`"


def _numerics_text(n) -> str:
    if not n:
        return "not recorded"
    return "; ".join(f"{k} {v}" for k, v in n.items() if v is not None) or "not recorded"


def _batching_text(b) -> str:
    if not b:
        return "not recorded"
    caps = ", ".join(map(str, b.get("batch_size_caps", []))) or "none"
    return (f"batch_size cap {caps}; largest planned batch {b.get('largest_batch_prompts', 0)} prompts "
            f"over {b.get('memory_plans', 0)} memory plans; out-of-memory splits {b.get('oom_splits', 0)}")


def card_markdown(card: dict) -> str:
    e = card["envelope"]
    lines = [
        f"# GRID card: {card['model']} on {card['benchmark']}", "",
        *([f"**{card['stale']}**", ""] if card.get("stale") else []),
        "| field | value |", "|---|---|",
        f"| model id | `{card['model_id']}` |",
        f"| weights hash | `{card['weights_hash']}` |",
        f"| quantization | {card['quantization']} |",
        f"| device | {card['device']} |",
        f"| chat template | {_chat_template_text(card.get('chat_template_hash'))} |",
        f"| numerics | {_numerics_text(card.get('numerics'))} |",
        f"| batches | {_batching_text(card.get('batching'))} |",
        "| templates | " + ", ".join(f"{t['id']} (`{t['text_hash'][:12]}`)" for t in card["templates"]) + " |",
        f"| decodings | {', '.join(card['decodings'])} |",
        f"| shots | {', '.join(card['shots'])} |",
        f"| scoring paths | {', '.join(card['scoring_paths'])} |",
        f"| parser version | {card['parser_version']} |",
        f"| item subset | `{card['items']['subset_hash']}` ({card['items']['item_ids_path']}; "
        f"n = {', '.join(map(str, card['items']['n_items'])) or '?'}) |",
        f"| rules stamp | `{card['rules_stamp']}` |",
        f"| config hash | `{card['config_hash']}` |",
        f"| code version | run {version_text(card['code_version']['run'])}; cell scores "
        f"{version_text(card['code_version']['cell_scores'])}; analysis {card['code_version']['analysis']} |",
        "", "## Envelope", "",
        f"{e['n_configs']} configs; score range {e['score_min']:.3f} ({e['config_min']}) to "
        f"{e['score_max']:.3f} ({e['config_max']}), width {e['score_range']:.3f}, median {e['score_median']:.3f}.",
        "", "## Verdicts against the other models (Prop. 1)", "",
        "ahead / behind / tied count configs; *noise* is rho_flip of two exchangeable models on the same "
        "items (mean, and p = share of such draws with at least this rho_flip); *sig* columns count configs "
        "where the difference on the same items is significant after the family-wise correction; "
        "rho_flip_sig = min(sig ahead, sig behind)/|C|; *mdd*: the median difference a config needs to be "
        "detected with 80% power (docs/VERDICTS.md).", "",
        "| other | ahead | behind | tied | rho_flip | noise mean | noise p | rho_flip_sig | sig ahead | sig behind "
        "| crossover p | pattern | mdd | ceiling | D1 | D2 | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in card["comparisons"]:
        sg = c.get("significance")
        sig_cells = ("– | – | – | – | – | – | – | needs item results" if sg is None else
                     f"{sg['rho_flip_null_mean']:.3f} | {sg['rho_flip_null_p']:.3g} | "
                     f"{sg['rho_flip_sig']:.3f} | {sg['n_ahead_sig']} | {sg['n_behind_sig']} | "
                     f"{sg['crossover_p']:.3g} | **{sg['pattern_text']}** | "
                     + (f"{sg['mdd_median']:.3f}" if np.isfinite(sg['mdd_median']) else "none detectable"))
        lines.append(f"| {c['other']} | {c['n_ahead']} | {c['n_behind']} | {c['n_tied']} | {c['rho_flip']:.3f} | "
                     f"{sig_cells} | {c['ceiling']:.3f} | {'yes' if c['d1'] else 'no'} | "
                     f"{'yes' if c['d2'] else 'no'} | {c['verdict']} |")
    if not card["comparisons"]:
        lines.append("| (no other model on this benchmark) |" + " |" * 16)
    xp = card.get("cross_package")
    if xp:
        lines += ["", "## The nominal configuration in other packages", "",
                  f"Spread across packages on this benchmark: {xp['spread_pp']:.1f} pp (this model: "
                  f"{xp['spread_model_pp']:.1f} pp); model ordering changes across packages: "
                  f"{'yes' if xp['ordering_changes'] else 'no'} (docs/CROSS_PACKAGE.md).", "",
                  "| package | version | precision | compute | score | items | agreement with the nominal cell "
                  "| prompt sha256 |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in xp["rows"]:
            ag = "–" if r["agreement"] is None else f"{r['agreement']:.3f}"
            lines.append(f"| {r['package']} | {r['version']} | {r['precision']} | {r.get('compute') or '–'} | "
                         f"{r['score']:.3f} | {r['n_items']} | "
                         f"{ag} | `{r['prompt_sha256'][:12]}` |")
    pc = card.get("precision_check")
    if pc:
        lines += ["", "## BF16 vs NF4 (precision check)", "",
                  (f"This model's {pc['n_cells']} paired cells: |bf16 - {pc['quantization_main']}| median "
                   f"{pc['abs_diff_median']:.3f}, mean {pc['abs_diff_mean']:.3f}, max {pc['abs_diff_max']:.3f}; "
                   if pc["n_cells"] else "No paired cells of this model; ")
                  + f"the model ordering on this benchmark agrees on {pc['orderings_agree']} paired configs "
                  "(docs/VERDICTS.md, section 8)."]
    revs = [(c["other"], c.get("nearest_reversal")) for c in card["comparisons"] if c.get("nearest_reversal")]
    if revs:
        lines += ["", "## Nearest reversing configuration", "",
                  "Fewest axis changes from the nominal config to a config where the verdict reverses "
                  "(docs/VERDICTS.md).", ""]
        for other, r in revs:
            if not r["reference_config"]:
                lines.append(f"- vs {other}: {r['note']}")
                continue
            ref = r["reference_config"] + ("" if r["reference_config"] == r["nominal_config"]
                                           else f" (standing in for {r['nominal_config']})")
            lead = r["leader_at_reference"]
            lines.append(f"- vs {other}: {'tied' if lead == 'tie' else lead + ' ahead'} at {ref}; "
                         f"strict reversal: {r['strict']}; significant reversal: {r['significant']}")
    if card.get("scale_probe"):
        lines += ["", "## Scale probe (a larger sibling in place of a model)", ""]
        lines += [f"- {line}" for line in card["scale_probe"]]
    return "\n".join(lines) + "\n"


def cross_package_entry(xp: pd.DataFrame, model: str, benchmark: str) -> dict | None:
    """The card's cross-package block: this model's rows of the cross-package table."""
    sub = xp[(xp["model"] == model) & (xp["benchmark"] == benchmark)]
    if sub.empty:
        return None
    rows = [{"package": r.package, "version": str(r.version), "precision": str(r.precision),
             "compute": None if pd.isna(getattr(r, "compute", None)) else str(r.compute),
             "numerics": str(r.numerics), "score": float(r.score), "n_items": int(r.n_items),
             "agreement": None if pd.isna(r.agreement) else float(r.agreement),
             "prompt_sha256": r.prompt_sha256, "object": r.object} for r in sub.itertuples()]
    first = sub.iloc[0]
    return {"spread_pp": float(first["spread_pp"]), "spread_model_pp": float(first["spread_model_pp"]),
            "ordering_changes": bool(first["ordering_changes"]), "rows": rows}


def precision_entry(summary: pd.DataFrame, cells: pd.DataFrame, model: str, benchmark: str) -> dict | None:
    """The card's precision-check block: this model's paired cells on ``benchmark`` (|diff|
    median / mean / max) and the benchmark's ordering agreement; None when the check has no
    row for the benchmark."""
    row = summary[summary["benchmark"] == benchmark]
    if row.empty:
        return None
    row = row.iloc[0]
    d = cells.loc[(cells["model"] == model) & (cells["benchmark"] == benchmark), "abs_diff"].astype(float)
    stat = lambda f: float(f(d)) if len(d) else None  # noqa: E731
    return {"n_cells": int(len(d)), "abs_diff_median": stat(pd.Series.median), "abs_diff_mean": stat(pd.Series.mean),
            "abs_diff_max": stat(pd.Series.max), "orderings_agree": str(row["orderings_agree"]),
            "n_orderings_match": int(row["n_orderings_match"]), "n_configs_paired": int(row["n_configs_paired"]),
            "quantization_main": str(row["quantization_main"])}


def scale_probe_entry(sp: pd.DataFrame, model: str, benchmark: str) -> list[str] | None:
    """The card's scale-probe lines: the rows of the ``scale_probe`` table where this model is
    a family's small or large member (:func:`.scale_probe.probe_line`)."""
    sub = sp[(sp["benchmark"] == benchmark) & ((sp["small"] == model) | (sp["large"] == model))]
    return [probe_line(r) for r in sub.to_dict("records")] or None


def build_cards(cells: pd.DataFrame, provenance: Mapping | str | Path, meta: dict,
                significance: pd.DataFrame | None = None, reversal: pd.DataFrame | None = None) -> list[dict]:
    prov = load_provenance(provenance)
    pairs = pairwise_table(cells)
    cards = []
    for m, b in sorted(set(zip(cells["model"], cells["benchmark"]))):
        if (m, b) not in prov:
            raise ConfigError("provenance", f"{m}.{b}", "no provenance record for this (model, benchmark)")
        cards.append(build_card(m, b, cells, pairs, prov[(m, b)], meta, significance, reversal))
    return cards


def write_cards(cell_scores_path: str | Path, provenance: Mapping | str | Path,
                out_dir: str | Path, significance_path: str | Path | None = None,
                reversal_path: str | Path | None = None,
                cross_package_path: str | Path | None = None,
                precision_path: str | Path | None = None,
                scale_probe_path: str | Path | None = None) -> dict[str, Path]:
    """``<out_dir>/<model>__<benchmark>.json`` and ``.md`` per card plus ``index.json``.
    ``significance_path``: the ``significance`` table; ``reversal_path``: the
    ``nearest_reversal`` table; ``precision_path``: the ``precision`` table, its
    ``precision_cells`` beside it (all optional; from the same run)."""
    cs = load_cell_scores(cell_scores_path)
    sig = rev = None
    sources = [(cs.path, cs.meta)]
    if significance_path is not None:
        sig, smeta = read_table(significance_path)
        check_same_rules((cs.path, cs.meta), (Path(significance_path), smeta))
        sources.append((Path(significance_path), smeta))
    if reversal_path is not None:
        rev, rmeta = read_table(reversal_path)
        check_same_rules((cs.path, cs.meta), (Path(reversal_path), rmeta))
        sources.append((Path(reversal_path), rmeta))
    xp = None
    if cross_package_path is not None:
        xp, xmeta = read_table(cross_package_path)
        sources.append((Path(cross_package_path), xmeta))
    prec = None
    if precision_path is not None:
        cells_path = table_outputs("precision", Path(precision_path).parent)["precision_cells"]
        prec = [read_table(precision_path), read_table(cells_path)]
        for p, (_, pmeta) in zip((Path(precision_path), cells_path), prec):
            check_same_rules((cs.path, cs.meta), (p, pmeta))
            sources.append((p, pmeta))
    sp = None
    if scale_probe_path is not None:
        sp, pmeta = read_table(scale_probe_path)
        check_same_rules((cs.path, cs.meta), (Path(scale_probe_path), pmeta))
        sources.append((Path(scale_probe_path), pmeta))
    cards = build_cards(cs.df, provenance, cs.meta, sig, rev)  # everything computed before anything is written
    # any source written by other code than the current (cell scores, significance, nearest reversal)
    stale = "; ".join(n for n in (source_stale_note(p, m) for p, m in sources) if n) or None
    for card in cards:
        card["stale"] = stale
        if xp is not None:
            card["cross_package"] = cross_package_entry(xp, card["model"], card["benchmark"])
        if prec is not None:
            card["precision_check"] = precision_entry(prec[0][0], prec[1][0], card["model"], card["benchmark"])
        if sp is not None:
            card["scale_probe"] = scale_probe_entry(sp, card["model"], card["benchmark"])
    out_dir = Path(out_dir)
    paths: dict[str, Path] = {}
    index = []
    for card in cards:
        stem = card_stem(card["model"], card["benchmark"])
        atomic_write_text(out_dir / f"{stem}.json", json.dumps(card, indent=2, sort_keys=False) + "\n")
        atomic_write_text(out_dir / f"{stem}.md", card_markdown(card))
        paths[f"{stem}.json"] = out_dir / f"{stem}.json"
        paths[f"{stem}.md"] = out_dir / f"{stem}.md"
        index.append({"model": card["model"], "benchmark": card["benchmark"], "json": f"{stem}.json",
                      "markdown": f"{stem}.md"})
    atomic_write_text(out_dir / CARDS_INDEX, json.dumps(
        {"source": str(cs.path), "rules_stamp": cs.meta["rules_stamp"], "config_hash": cs.meta["config_hash"],
         "code_version": cs.meta["code_version"], "analysis_code_version": code_version_string(),
         **code_stamp(__name__), "sources": [source_record(p, m) for p, m in sources], "stale": stale,
         "dropped_incomplete_configs": cs.dropped,
         "nominal_config": None if rev is None or rev.empty else str(rev["nominal_config"].iloc[0]),
         "cards": index}, indent=2) + "\n")
    paths["index"] = out_dir / CARDS_INDEX
    return paths
