"""`safetyrepro certify`: the metric core pointed at anyone's long score table.

Input: CSV or Parquet with ``model, benchmark, config, score`` (or axis columns joined into
``config``, ``--config-cols``); every problem is a DataError naming the file. A config-level
table gets sign counts, rho_flip, D1/D2, orderings and tau_R; an item-level one (an ``item``
column; exact cell scores for fractions k/q, q <= 1000) also everything of
:mod:`.metrics.significance`. ``--nominal`` adds the nearest reversing configuration
(:mod:`.metrics.reversal`). Usage: docs/GUIDE.md.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import DataError
from .metrics import benchmark_summary, nearest_reversal_table, pairwise_table, reversal_line
from .metrics.compare import TieRule, tie_rule
from .metrics.itemgrid import MAX_ABS_SCORE
from .metrics.reversal import sig_signs_from_configs
from .metrics.significance import (Settings, headline_sentence, item_grid_from_scores,
                                   significance_tables)


class _CallableModule(types.ModuleType):
    """``safetyrepro.certify`` names this module (importing a submodule binds its name on the
    package), so the module itself is the API call: ``safetyrepro.certify(df, ...)``."""

    def __call__(self, table, **options):
        return certify_table(table, **options)


sys.modules[__name__].__class__ = _CallableModule


REQUIRED = ("model", "benchmark", "score")
ITEM = "item"
DATAFRAME = "<DataFrame>"   # how errors and the result's ``source`` name an in-memory table
NEEDS_ITEMS = ("the noise references (rho_flip_null_*), significance (N+_sig, N-_sig, rho_flip_sig, the "
               "crossover decision), power and the item-bootstrap spread of rho_flip need item-level input: "
               "a long table with an 'item' column (model, benchmark, config, item, score)")


@dataclass
class CertifyResult:
    pairs: pd.DataFrame
    summary: pd.DataFrame
    dropped_configs: dict          # benchmark -> list of config ids dropped as incomplete
    source: str
    tie_rule: TieRule              # how ties were decided (every quantity, tau_R included)
    level: str = "config"          # config | item
    significance: dict | None = None   # name -> table (item-level input only)
    params: dict | None = None
    reversal: pd.DataFrame | None = None   # nearest reversing configuration (with --nominal)
    nominal: str | None = None
    warnings: list = field(default_factory=list)   # e.g. a resampling that cannot reach alpha


def _check_csv_shape(path: Path) -> None:
    """Every header column named, once, and every row as many fields as the header (pandas
    would silently take a trailing comma as an index column, shifting every value)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                raise DataError(path, "empty file (no header row)")
            blank = [i + 1 for i, h in enumerate(header) if not h.strip()]
            if blank:
                raise DataError(path, f"header column(s) {blank} have no name (a trailing comma on every line?)",
                                row=1)
            twice = sorted({h for h in header if header.count(h) > 1})
            if twice:
                raise DataError(path, f"header names column(s) {twice} more than once", row=1)
            for row in reader:
                if row and len(row) != len(header):
                    raise DataError(path, f"{len(row)} fields where the header has {len(header)} "
                                          f"({', '.join(header)})", row=reader.line_num)
    except UnicodeDecodeError as exc:
        raise DataError(path, f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except csv.Error as exc:
        raise DataError(path, f"not a well-formed CSV file ({exc})") from None
    except OSError as exc:
        raise DataError(path, f"cannot read: {exc.strerror or exc}") from None


def _as_text(df: pd.DataFrame, col: str, path, first: int, rows_are: str) -> pd.Series:
    """A key or axis column as text: numbers and booleans as written, bytes decoded as
    UTF-8; anything else (lists, maps, undecodable bytes) refused naming the row."""
    kind = pd.api.types.infer_dtype(df[col], skipna=False)
    if kind in ("string", "integer", "floating", "boolean", "mixed-integer-float", "categorical"):
        return df[col].astype(str)        # the common case, without a Python loop per cell
    out = []
    for i, v in enumerate(df[col].tolist()):
        if isinstance(v, (bytes, bytearray)):
            try:
                v = bytes(v).decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(path, f"column '{col}' holds bytes that are not UTF-8 text ({rows_are})",
                                row=i + first) from None
        elif not isinstance(v, (str, int, float, bool, np.generic)):
            raise DataError(path, f"column '{col}' holds a {type(v).__name__}, not a name ({rows_are})",
                            row=i + first)
        out.append(str(v))
    return pd.Series(out, index=df.index, dtype=object)


def _as_score(v) -> float:
    """A score cell as a float; NaN for anything that is not one real number."""
    if isinstance(v, (bytes, bytearray)):
        v = bytes(v).decode("utf-8", "replace")
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        return float("nan")


def _check_config_cols(config_cols, path) -> None:
    cols = list(config_cols)
    if not cols or any(not str(c).strip() for c in cols):
        raise DataError(path, f"--config-cols: empty column name in {cols}")
    twice = sorted({c for c in cols if cols.count(c) > 1})
    if twice:
        raise DataError(path, f"--config-cols names {twice} more than once")
    reserved = [c for c in cols if c in REQUIRED + (ITEM,)]
    if reserved:
        raise DataError(path, f"--config-cols: {reserved} cannot be axis columns (model, benchmark, item "
                              "and score are the table's keys and values)")


def read_score_table(path: str | Path, config_cols: list[str] | None = None) -> pd.DataFrame:
    """Read a CSV or Parquet score table and validate it (:func:`validate_score_table`)."""
    path = Path(path)
    if not path.exists():
        raise DataError(path, "file not found")
    if not path.is_file():
        raise DataError(path, "not a file")
    if config_cols is not None:
        _check_config_cols(config_cols, path)
    parquet = path.suffix.lower() in {".parquet", ".pq"}
    if not parquet:
        _check_csv_shape(path)
    try:
        if parquet:
            df = pd.read_parquet(path)
        else:
            # round_trip: the default C parser can be off in the last bit (0.59999999999999998
            # read as 0.5999999999999999), which would break exact k/q recovery
            df = pd.read_csv(path, encoding="utf-8-sig", float_precision="round_trip", index_col=False)
    except Exception as exc:
        raise DataError(path, f"cannot read as {'Parquet' if parquet else 'CSV'}: {exc}") from exc
    return validate_score_table(df, path, config_cols, csv_rows=True)


def validate_score_table(df: pd.DataFrame, path: str | Path, config_cols: list[str] | None = None,
                         csv_rows: bool = False) -> pd.DataFrame:
    """Check a long score table (``path`` names it in errors) and return the columns certify
    uses, keys as strings and scores as floats. Errors give row numbers as a file's lines
    (header = 1) with ``csv_rows``, else as positions in ``df`` (first row = 0). Scores must
    be finite with |score| <= MAX_ABS_SCORE (the item grid's bound), for config-level tables
    too, so a bad value is refused before any statistic runs."""
    if not isinstance(df, pd.DataFrame):
        raise DataError(path, f"expected a pandas DataFrame or a file path, got {type(df).__name__}")
    if config_cols is not None:
        _check_config_cols(config_cols, path)
    twice = sorted({str(c) for c in df.columns if list(df.columns).count(c) > 1})
    if twice:
        raise DataError(path, f"column(s) {twice} appear more than once")
    df = df.reset_index(drop=True)
    first, rows_are = (2, "row numbers count the header as 1") if csv_rows else (0, "row positions, first = 0")

    def rows(mask) -> list[int]:
        return (df.index[mask] + first).tolist()[:10]

    need = list(REQUIRED) + (list(config_cols) if config_cols else ["config"])
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise DataError(path, f"missing column(s) {missing}; found {list(df.columns)}"
                        + ("" if config_cols else " (or pass --config-cols with axis column names)"))
    if config_cols:
        df = df.copy()
        for col in config_cols:
            if df[col].isna().any():
                raise DataError(path, f"empty axis column '{col}' in row(s) {rows(df[col].isna())} ({rows_are})")
            df[col] = _as_text(df, col, path, first, rows_are)
        df["config"] = df[list(config_cols)].agg("-".join, axis=1)
    keys = ["model", "benchmark", "config"] + ([ITEM] if ITEM in df.columns else [])
    axes = [c for c in (config_cols or []) if c not in keys + ["score"]]
    df = df[keys + ["score"] + axes].copy()
    for col in keys:
        if df[col].isna().any():
            raise DataError(path, f"empty '{col}' in row(s) {rows(df[col].isna())} ({rows_are})")
        df[col] = _as_text(df, col, path, first, rows_are)
    num = df["score"].map(_as_score).astype(float)
    bad = ~np.isfinite(num)
    if bad.any():
        vals = [repr(v) if isinstance(v, (bytes, bytearray)) else str(v) for v in df.loc[bad, "score"].tolist()[:10]]
        raise DataError(path, f"non-numeric, NaN or infinite score in row(s) {rows(bad)}: {vals}")
    big = num.abs() > MAX_ABS_SCORE
    if big.any():
        raise DataError(path, f"score out of range (|score| <= {MAX_ABS_SCORE:g}) in row(s) {rows(big)}: "
                              f"{num[big].tolist()[:10]}")
    df["score"] = num
    dup = df.duplicated(keys, keep=False)
    if dup.any():
        d = df[dup].sort_values(keys)
        names = sorted({"(" + ", ".join(str(getattr(r, k)) for k in keys) + ")" for r in d.itertuples()})
        raise DataError(path, f"duplicate ({', '.join(keys)}) rows: {', '.join(names[:10])}"
                        + (f" and {len(names) - 10} more" if len(names) > 10 else ""))
    return df


def _cells_from_items(df: pd.DataFrame, path) -> tuple[pd.DataFrame, list]:
    """Item-level table -> (cell table with exact fractions where possible, item grids)."""
    rows, grids = [], []
    for b, sub in df.groupby("benchmark", sort=True):
        try:
            g = item_grid_from_scores(sub, str(b), where=str(path))
        except ValueError as exc:
            raise DataError(path, str(exc)) from None
        grids.append(g)
        cells = g.cell_scores()
        for i, m in enumerate(g.models):
            for j, c in enumerate(g.configs):
                r = {"model": m, "benchmark": b, "config": c, "score": float(cells.value[i, j])}
                if cells.exact:
                    r.update(score_num=int(cells.num[i, j]), score_den=int(cells.den[i, j]))
                rows.append(r)
    return pd.DataFrame(rows), grids


def incomplete_cells(df: pd.DataFrame) -> dict[str, list[tuple[str, str]]]:
    """benchmark -> [(model, config)] cells missing for a model that other models have."""
    out = {}
    for b, sub in df.groupby("benchmark"):
        models = sorted(sub["model"].unique())
        have = set(zip(sub["model"], sub["config"]))
        configs = sorted(sub["config"].unique())
        missing = [(m, c) for c in configs for m in models if (m, c) not in have]
        if missing:
            out[b] = missing
    return out


def nominal_levels(df: pd.DataFrame, nominal: str, axes: list[str], path: str | Path) -> dict[str, str]:
    """The nominal config's level per axis column: from a row of the table with that config id,
    else from splitting the id on '-' when that gives one value per axis."""
    hit = df[df["config"] == nominal]
    if len(hit):
        return {a: str(hit.iloc[0][a]) for a in axes}
    parts = nominal.split("-")
    if len(parts) == len(axes):
        return dict(zip(axes, parts))
    raise DataError(path, f"--nominal {nominal!r} is no config of the table and does not split on '-' into "
                          f"one value per axis column {axes}")


def _reversal(df: pd.DataFrame, cell_df: pd.DataFrame, nominal: str, axes: list[str], tol, sig, path):
    """The nearest-reversal table on the cell table (axis levels taken from the input rows)."""
    levels = df.drop_duplicates("config").set_index("config")[axes]
    cells = cell_df.drop(columns=[a for a in axes if a in cell_df.columns]).join(levels, on="config")
    sig_signs = None if sig is None else sig_signs_from_configs(sig["significance_configs"])
    return nearest_reversal_table(cells, nominal, axes, tol, sig_signs=sig_signs,
                                  nominal_levels=nominal_levels(df, nominal, axes, path))


def certify_table(table: pd.DataFrame | str | os.PathLike, *, config_cols: str | Iterable[str] | None = None,
                  alpha: float = 0.05, tol: float | None = None, samples: int | None = None, seed: int = 0,
                  nominal: str | None = None, drop_incomplete: bool = False, family: str = "pair",
                  correction: str = "maxt") -> CertifyResult:
    """Verdict metrics of a long score table (a DataFrame, or a CSV/Parquet path): the same
    computation as ``safetyrepro certify``, whose options these are (``config_cols``: axis column
    names, a list or ``"a,b,c"``; ``samples``/``seed``: the resampling, ``samples=None`` picking
    the count; ``family``/``correction``: the multiplicity family and its correction). The result holds
    DataFrames: ``pairs``, ``summary`` (per benchmark), ``significance`` (item-level input) and
    ``reversal`` (with ``nominal``); :func:`to_json` gives the CLI's JSON. The module is callable
    as this function: ``safetyrepro.certify(df, ...)``."""
    if isinstance(config_cols, str):
        config_cols = [c.strip() for c in config_cols.split(",") if c.strip()]
    cols = list(config_cols) if config_cols is not None else None
    return certify(table, cols or None, drop_incomplete, tol, alpha=alpha, samples=samples, seed=seed,
                   nominal=nominal, family=family, correction=correction)


def certify(path: str | Path | pd.DataFrame, config_cols: list[str] | None = None, drop_incomplete: bool = False,
            tol: float | None = None, *, alpha: float = 0.05, samples: int | None = None, seed: int = 0,
            nominal: str | None = None, family: str = "pair", correction: str = "maxt") -> CertifyResult:
    """Verdict metrics of an external table: a CSV/Parquet path or a DataFrame with the same
    columns (named ``<DataFrame>`` in errors). Without ``tol``, float scores equal within 1e-12
    relative tie (exact fractions recovered from item-level scores compare exactly);
    ``tol > 0``: |difference| <= tol ties, for every quantity. ``samples=None`` picks the
    resampling count so every corrected p can reach alpha; ``family`` (pair | benchmark |
    table) and ``correction`` (maxt | holm) set the multiplicity family and its correction."""
    table = path if isinstance(path, pd.DataFrame) else None
    if table is not None:
        path = DATAFRAME
    settings = Settings(alpha, samples, seed, tol, family, correction)
    try:
        settings.check()
    except ValueError as exc:
        raise DataError(path, str(exc)) from None
    if tol is not None and (not tol >= 0 or tol == float("inf")):
        raise DataError(path, f"--tol must be a finite number >= 0 (got {tol})")
    if nominal is not None and not config_cols:
        raise DataError(path, "--nominal needs axis columns (--config-cols template,decoding,shots,scoring): "
                              "the distance to a reversing config counts axis changes")
    df = read_score_table(path, config_cols) if table is None else validate_score_table(table, path, config_cols)
    item_level = ITEM in df.columns
    cells = df.drop_duplicates(["model", "benchmark", "config"]) if item_level else df
    missing = incomplete_cells(cells)
    dropped: dict = {}
    if missing:
        if not drop_incomplete:
            lines = [f"  {b}: " + ", ".join(f"{m} @ {c}" for m, c in cl[:20])
                     + (f" ... ({len(cl)} in all)" if len(cl) > 20 else "")
                     for b, cl in sorted(missing.items())]
            raise DataError(path, "configs present for some models but not others; missing cells:\n"
                            + "\n".join(lines) + "\n(--drop-incomplete drops those configs for every model)")
        for b, cl in missing.items():
            bad_cfgs = sorted({c for _, c in cl})
            dropped[b] = bad_cfgs
            df = df[~((df["benchmark"] == b) & (df["config"].isin(bad_cfgs)))]
    for b, sub in df.groupby("benchmark"):
        if sub["model"].nunique() < 2:
            raise DataError(path, f"benchmark {b!r} has fewer than two models after validation")
    if df.empty:
        raise DataError(path, "no complete configs left")
    params = {"tol": tol, "alpha": alpha, "samples": samples, "seed": seed, "family": family,
              "correction": correction}
    axes = list(config_cols or [])
    if not item_level:
        rev = None if nominal is None else _reversal(df, df, nominal, axes, tol, None, path)
        return CertifyResult(pairwise_table(df, tol=tol), benchmark_summary(df, tol=tol), dropped, str(path),
                             tie_rule(tol, exact=False), "config", None, params, rev, nominal)
    cell_df, grids = _cells_from_items(df, path)
    exact = all(g.exact for g in grids)
    if not exact:   # one rule for the whole table
        cell_df = cell_df.drop(columns=[c for c in ("score_num", "score_den") if c in cell_df.columns])
    warnings: list[str] = []
    try:
        sig = significance_tables(grids, settings, table=f"certify {path}", warnings=warnings)
    except ValueError as exc:
        raise DataError(path, str(exc)) from None
    params["samples"] = int(sig["significance"]["samples"].max()) if len(sig["significance"]) else samples
    rev = None if nominal is None else _reversal(df, cell_df, nominal, axes, tol, sig, path)
    return CertifyResult(pairwise_table(cell_df, tol=tol), benchmark_summary(cell_df, tol=tol), dropped,
                         str(path), tie_rule(tol, exact=exact), "item", sig, params, rev, nominal, warnings)


def to_json(res: CertifyResult) -> str:
    out = {
        "source": res.source,
        "level": res.level,
        "tie_rule": res.tie_rule.as_dict(),
        "params": res.params or {},
        "dropped_configs": res.dropped_configs,
        "pairs": json.loads(res.pairs.to_json(orient="records")),
        "benchmarks": json.loads(res.summary.to_json(orient="records")),
    }
    if res.significance is None:
        out["significance"] = None
        out["significance_note"] = NEEDS_ITEMS
    else:
        out["significance"] = {k: json.loads(v.to_json(orient="records")) for k, v in res.significance.items()}
    if res.reversal is not None:
        out["nominal"] = res.nominal
        out["nearest_reversal"] = json.loads(res.reversal.to_json(orient="records"))
    out["warnings"] = list(res.warnings)
    return json.dumps(out, indent=2)


def _fmt(df: pd.DataFrame, cols: dict[str, str]) -> pd.DataFrame:
    df = df.copy()
    for c, f in cols.items():
        if c in df.columns:
            df[c] = df[c].map(f.format)
    return df


def to_text(res: CertifyResult) -> str:
    out = [f"ties: {res.tie_rule.describe()}"]
    out += [f"warning: {w}" for w in res.warnings]
    if res.dropped_configs:
        n = sum(len(v) for v in res.dropped_configs.values())
        out.append(f"dropped {n} incomplete config(s): "
                   + "; ".join(f"{b}: {len(v)}" for b, v in sorted(res.dropped_configs.items())))
    sig = res.significance
    if sig is not None:
        bench = sig["significance_benchmarks"]
        pr = res.params
        out.append(f"Verdicts read against noise (alpha = {pr['alpha']:g}; family: {pr['family']}, correction: "
                   f"{pr['correction']}; seed {pr['seed']})")
        out += ["  " + headline_sentence(r) for r in bench.to_dict("records")]
        out.append("")
    p = res.pairs.drop(columns=["tie_rule"])
    if sig is not None:
        p = p.merge(sig["significance"][["benchmark", "model_a", "model_b", "rho_flip_null_mean",
                                         "rho_flip_null_q95", "rho_flip_null_p"]],
                    on=["benchmark", "model_a", "model_b"], how="left")
    p = _fmt(p, {"rho_flip": "{:.3f}", "ceiling": "{:.3f}", "rho_flip_null_mean": "{:.3f}",
                 "rho_flip_null_q95": "{:.3f}", "rho_flip_null_p": "{:.3g}"})
    out.append("Pairwise verdict stability (N+ counts configs where model_a scores higher"
               + ("; rho_flip_null_*: two exchangeable models, item-wise sign flips)" if sig is not None else ")"))
    out.append(p.to_string(index=False))
    s = res.summary.copy()
    s["orderings"] = s["orderings_reachable"].astype(str) + " of " + s["orderings_possible"].astype(str)
    cols = ["benchmark", "n_models", "n_configs", "max_rho_flip", "max_pair", "orderings", "tied_configs", "tau_r",
            "order_change_rate"]
    if sig is not None:
        s = s.merge(sig["significance_benchmarks"][["benchmark", "max_rho_flip_null_p", "orderings_null_mean",
                                                    "orderings_null_p", "order_change_null_mean",
                                                    "order_change_null_p"]], on="benchmark", how="left")
        cols += ["max_rho_flip_null_p", "orderings_null_mean", "orderings_null_p", "order_change_null_mean",
                 "order_change_null_p"]
    s = _fmt(s, {"max_rho_flip": "{:.3f}", "tau_r": "{:.3f}", "order_change_rate": "{:.3f}",
                 "max_rho_flip_null_p": "{:.3g}", "orderings_null_mean": "{:.2f}", "orderings_null_p": "{:.3g}",
                 "order_change_null_mean": "{:.3f}", "order_change_null_p": "{:.3g}"})
    out.append("")
    out.append("Per benchmark")
    out.append(s[cols].to_string(index=False))
    out.append("(order_change_rate: share of config pairs whose induced model orders differ; not rho_flip; "
               "1 - 1/n! is its value only for exchangeable strict orders"
               + ("; the *_null_* columns are its reference under exchangeable models)" if sig is not None else ")"))
    if res.reversal is not None:
        out.append("")
        out.append(f"Nearest reversing configuration from {res.nominal} (fewest axis changes)")
        out += [reversal_line(r) for r in res.reversal.to_dict("records")]
    out.append("")
    if sig is None:
        out.append(f"Significance: not computed; {NEEDS_ITEMS}.")
        return "\n".join(out)
    t = _fmt(sig["significance"], {"rho_flip": "{:.3f}", "rho_flip_sig": "{:.3f}", "crossover_p": "{:.4g}",
                                   "mdd_median": "{:.3f}", "min_attainable_p": "{:.3g}"})
    out.append("Significance (item level; per-config sign-flip tests, corrected over the family; "
               "mdd: smallest difference detected with 80% power)")
    out.append(t[["benchmark", "model_a", "model_b", "n_configs", "n_items", "n_plus", "n_minus", "rho_flip",
                  "n_plus_sig", "n_minus_sig", "rho_flip_sig", "crossover_p", "pattern", "mdd_median",
                  "resampling", "min_attainable_p"]].to_string(index=False))
    bi = _fmt(sig["bootstrap_items"], {"estimate": "{:.3f}", "ci_low": "{:.3f}", "ci_high": "{:.3f}"})
    out.append("")
    out.append("Spread of the plug-in rho_flip when items are redrawn (configs fixed; percentile 2.5-97.5). "
               "Not a confidence interval: item noise biases rho_flip up")
    out.append(bi[["benchmark", "statistic", "estimate", "ci_low", "ci_high"]].to_string(index=False))
    return "\n".join(out)
