"""The scale probe: does swapping a model for its larger sibling reverse a verdict?

Per benchmark and family (small, large), over the configs of one sub-envelope (default
``conservative_core``) that every model has, on the run's items: a bounded statement, not a
claim about scale in general. ``scale_probe`` compares small's and large's strict signs
against every third model (significant where ``significance_configs`` says so both ways);
``scale_probe_pairs`` counts small vs large directly. Definitions: docs/VERDICTS.md section 9.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from ..errors import ConfigError, DataError
from ..metrics.compare import diff_sign, has_exact, score_grid, tie_rule
from ..metrics.flips import pair_stats
from ..metrics.reversal import sig_signs_from_configs
from ..rules import Rules, load_rules
from .common import AXES, check_rules_file, load_cell_scores, optional_source, output_metadata, write_tables

SUB_ENVELOPE = "conservative_core"
NO_SIG = "not computed: no item-level significance given"
NO_SIG_BENCH = "not computed: the significance analysis has no rows for this benchmark"
NO_CONFIGS = "no config of this benchmark in the sub-envelope"
PROBE_COLUMNS = ["benchmark", "small", "large", "third", "sub_envelope", "n_configs", "n_items",
                 "small_ahead", "small_behind", "large_ahead", "large_behind", "n_reversed", "reversed_configs",
                 "reverses", "n_reversed_sig", "reversed_sig_configs", "reverses_sig", "significance", "note"]
PAIR_COLUMNS = ["benchmark", "small", "large", "sub_envelope", "n_configs", "n_items", "n_plus", "n_minus",
                "n_zero", "rho_flip", "n_plus_sig", "n_minus_sig", "rho_flip_sig", "significance", "note"]

Family = tuple[str, str]
SigSigns = Mapping[tuple[str, str, str], Mapping[str, int]]


def parse_families(specs: Sequence[str | Sequence[str]], where: str = "--family") -> list[Family]:
    """Families from ``"small,large"`` strings (the CLI) or two-element lists (the config)."""
    out: list[Family] = []
    for i, spec in enumerate(specs):
        parts = [p.strip() for p in spec.split(",")] if isinstance(spec, str) else [str(p) for p in spec]
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"{where} #{i + 1}: expected 'small,large' (two model keys), got {spec!r}")
        if parts[0] == parts[1]:
            raise ValueError(f"{where} #{i + 1}: small and large are the same model {parts[0]!r}")
        out.append((parts[0], parts[1]))
    if not out:
        raise ValueError(f"{where}: no family given")
    if len(set(out)) != len(out):
        raise ValueError(f"{where}: a family is given twice")
    return out


def check_families(families: Sequence[Family], models: Sequence[str], where: str | Path) -> None:
    """Every family model is a model of the table, and each family has a third model."""
    models = set(models)
    for small, large in families:
        missing = [m for m in (small, large) if m not in models]
        if missing:
            raise DataError(where, f"scale-probe family ({small}, {large}): model(s) {missing} not in the "
                                   f"cell scores (models: {sorted(models)})")
        if not models - {small, large}:
            raise DataError(where, f"scale-probe family ({small}, {large}): no third model to compare against")


def sub_envelope_cells(df: pd.DataFrame, rules: Rules, name: str = SUB_ENVELOPE) -> pd.DataFrame:
    """The cells whose config lies in the sub-envelope ``name`` of ``rules``."""
    rules.sub_envelope(name)  # ConfigError naming the rules file when unknown
    keep = [rules.in_sub_envelope(name, lv) for lv in df[list(AXES)].astype(str).to_dict("records")]
    return df[np.asarray(keep, dtype=bool)].reset_index(drop=True)


def oriented_sig(sig: SigSigns | None, benchmark: str, x: str, y: str) -> dict[str, int] | None:
    """config -> +1 (x significantly ahead of y), -1 (y), 0 (neither); None when ``sig`` has
    no rows for the pair (stored as (A, B) with A < B by name)."""
    if sig is None:
        return None
    a, b = sorted((x, y))
    got = sig.get((benchmark, a, b))
    if got is None:
        return None
    return dict(got) if x == a else {c: -s for c, s in got.items()}


def _sig_vector(sig: dict[str, int], configs: list[str], benchmark: str, x: str, y: str,
                source: str | Path) -> np.ndarray:
    missing = [c for c in configs if c not in sig]
    if missing:
        raise DataError(source, f"({benchmark}, {x} vs {y}): no row for config {missing[0]!r} "
                                "of the cell scores (tables from different runs?)")
    return np.array([sig[c] for c in configs], dtype=int)


def _n_items(sub: pd.DataFrame) -> int | None:
    return int(sub["n_items"].max()) if "n_items" in sub.columns and len(sub) else None


def _sig_state(sig: SigSigns | None, *pairs) -> tuple[list | None, str]:
    """The oriented significance of each (benchmark, x, y) in ``pairs``, or None and why not."""
    if sig is None:
        return None, NO_SIG
    got = [oriented_sig(sig, *p) for p in pairs]
    if any(g is None for g in got):
        return None, NO_SIG_BENCH
    return got, "item-level: significance_configs (its family-wise corrected per-config tests)"


def probe_tables(df: pd.DataFrame, families: Sequence[Family], sig: SigSigns | None = None,
                 tol: float | None = None, sub_envelope: str = SUB_ENVELOPE, models: Sequence[str] | None = None,
                 benchmarks: Sequence[str] | None = None, source: str | Path = "cell_scores",
                 sig_source: str | Path = "significance_configs") -> dict[str, pd.DataFrame]:
    """``scale_probe`` and ``scale_probe_pairs`` (module doc) from cell rows already restricted
    to the sub-envelope (complete configs only; :func:`sub_envelope_cells`). ``models`` and
    ``benchmarks``: the run's (default: those of ``df``); a benchmark without rows in ``df``
    gets |C| = 0 rows. ``source`` / ``sig_source``: the tables' paths, named in errors."""
    probe, pairs = [], []
    models = sorted(models if models is not None else df["model"].unique())
    for b in sorted(benchmarks if benchmarks is not None else df["benchmark"].unique()):
        sub = df[df["benchmark"] == b]
        g = score_grid(sub)
        n_items = _n_items(sub)
        for small, large in families:
            base = {"benchmark": b, "small": small, "large": large, "sub_envelope": sub_envelope,
                    "n_configs": len(g.configs), "n_items": n_items}
            thirds = [m for m in (models if g.empty else g.models) if m not in (small, large)]
            if g.empty:
                for c in thirds:
                    probe.append({**base, "third": c, "note": NO_CONFIGS, "significance": "", "reverses": False,
                                  "reversed_configs": "", "reversed_sig_configs": "",
                                  **dict.fromkeys(("small_ahead", "small_behind", "large_ahead", "large_behind",
                                                   "n_reversed"), 0)})
                pairs.append({**base, "note": NO_CONFIGS, "significance": "",
                              **dict.fromkeys(("n_plus", "n_minus", "n_zero"), 0)})
                continue
            for m in (small, large):
                if m not in g.models:
                    raise DataError(source, f"benchmark {b!r}: scale-probe model {m!r} has no cell in "
                                                   f"{sub_envelope}")
            for c in thirds:
                s_s = diff_sign(g.column(small), g.column(c), tol)
                s_l = diff_sign(g.column(large), g.column(c), tol)
                rev = s_s * s_l < 0
                row = {**base, "third": c, "small_ahead": int(np.sum(s_s > 0)), "small_behind": int(np.sum(s_s < 0)),
                       "large_ahead": int(np.sum(s_l > 0)), "large_behind": int(np.sum(s_l < 0)),
                       "n_reversed": int(rev.sum()), "reverses": bool(rev.any()),
                       "reversed_configs": ",".join(np.asarray(g.configs)[rev]), "note": ""}
                got, row["significance"] = _sig_state(sig, (b, small, c), (b, large, c))
                row["reversed_sig_configs"] = ""
                if got is not None:
                    q_s, q_l = (_sig_vector(v, g.configs, b, x, c, sig_source) for v, x in zip(got, (small, large)))
                    srev = q_s * q_l < 0
                    row.update(n_reversed_sig=int(srev.sum()), reverses_sig=bool(srev.any()),
                               reversed_sig_configs=",".join(np.asarray(g.configs)[srev]))
                probe.append(row)
            st = pair_stats(g.column(small), g.column(large), tol)
            prow = {**base, **{k: st[k] for k in ("n_plus", "n_minus", "n_zero", "rho_flip")}, "note": ""}
            got, prow["significance"] = _sig_state(sig, (b, small, large))
            if got is not None:
                q = _sig_vector(got[0], g.configs, b, small, large, sig_source)
                np_, nm = int(np.sum(q > 0)), int(np.sum(q < 0))
                prow.update(n_plus_sig=np_, n_minus_sig=nm, rho_flip_sig=min(np_, nm) / len(g.configs))
            pairs.append(prow)
    out_probe = pd.DataFrame(probe, columns=PROBE_COLUMNS)
    out_pairs = pd.DataFrame(pairs, columns=PAIR_COLUMNS)
    for t, cols in ((out_probe, ("n_items", "n_reversed_sig")), (out_pairs, ("n_items", "n_plus_sig", "n_minus_sig"))):
        for col in cols:
            t[col] = t[col].astype("Int64")
    out_probe["reverses_sig"] = out_probe["reverses_sig"].astype("boolean")
    return {"scale_probe": out_probe, "scale_probe_pairs": out_pairs}


def probe_line(row: Mapping) -> str:
    """One bounded sentence for a ``scale_probe`` row (report and cards)."""
    scope = f"within {row['sub_envelope']} ({row['n_configs']} configs"
    scope += f", these {row['n_items']} items)" if not pd.isna(row.get("n_items")) else ", these items)"
    head = f"{row['benchmark']}: {row['small']} -> {row['large']} vs {row['third']} {scope}: "
    if row["n_configs"] == 0:
        return head + NO_CONFIGS
    if not row["reverses"]:
        text = "no verdict reverses"
    else:
        text = f"the verdict reverses on {row['n_reversed']} config(s) ({row['reversed_configs']})"
    sig = row.get("reverses_sig")
    if sig is None or pd.isna(sig):
        text += f"; significant reversal {row['significance'] or NO_SIG}"
    elif sig:
        text += f"; significantly on {row['n_reversed_sig']} ({row['reversed_sig_configs']})"
    else:
        text += "; none significantly"
    return head + text


def write_scale_probe(cell_scores_path: str | Path, out_dir: str | Path, families: Sequence[str | Sequence[str]], *,
                      significance_configs_path: str | Path | None = None, rules_path: str | Path | None = None,
                      sub_envelope: str = SUB_ENVELOPE, tol: float | None = None) -> dict[str, Path]:
    """The scale-probe tables from ``cell_scores.parquet`` (and, when given, the same run's
    ``significance_configs.parquet``); ``rules_path``: the run's envelope rules (default
    config/envelope.yaml), whose stamp must match the table's."""
    try:
        fams = parse_families(families)
    except ValueError as exc:
        raise ConfigError("scale-probe", "--family", str(exc)) from None
    cs = load_cell_scores(cell_scores_path)
    rules = load_rules(rules_path)
    check_rules_file(rules, cs.path, cs.meta)
    check_families(fams, cs.df["model"].unique(), cs.path)
    sources = [(cs.path, cs.meta)]
    sig = None
    sig_df = optional_source(significance_configs_path, cs, sources)
    if sig_df is not None:
        try:
            sig = sig_signs_from_configs(sig_df)
        except ValueError as exc:
            raise DataError(significance_configs_path, str(exc)) from None
    core = sub_envelope_cells(cs.df, rules, sub_envelope)
    tables = probe_tables(core, fams, sig, tol, sub_envelope, models=cs.df["model"].unique(),
                          benchmarks=cs.df["benchmark"].unique(), source=cs.path,
                          sig_source=significance_configs_path or "significance_configs")
    params = {"families": [list(f) for f in fams], "sub_envelope": sub_envelope, "rules": rules.path, "tol": tol,
              "tie_rule": tie_rule(tol, exact=has_exact(cs.df)).as_dict(),
              "significance": "significance_configs (its family-wise corrected per-config tests)"
              if sig is not None else "not computed (no item-level significance given)",
              "scope": "within the sub-envelope, on the run's items; not a scaling law"}
    return write_tables("scale-probe", tables, out_dir, lambda name: output_metadata(
        name, sources, params, {"dropped_incomplete_configs": cs.dropped}))


__all__ = ["SUB_ENVELOPE", "check_families", "oriented_sig", "parse_families", "probe_line", "probe_tables",
           "sub_envelope_cells", "write_scale_probe"]
