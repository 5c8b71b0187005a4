"""`safetyrepro certify`: the metric core pointed at anyone's long score table.

Accepted input: CSV or Parquet with columns ``model, benchmark, config, score``, or axis
columns instead of ``config`` (``--config-cols template,decoding,shots,scoring``: the config
id is their values joined by '-'). Every problem is reported as a DataError naming the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .errors import DataError
from .metrics import benchmark_summary, pairwise_table
from .metrics.compare import TieRule, tie_rule

REQUIRED = ("model", "benchmark", "score")


@dataclass
class CertifyResult:
    pairs: pd.DataFrame
    summary: pd.DataFrame
    dropped_configs: dict          # benchmark -> list of config ids dropped as incomplete
    source: str
    tie_rule: TieRule              # how ties were decided (every quantity, tau_R included)


def read_score_table(path: str | Path, config_cols: list[str] | None = None) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise DataError(path, "file not found")
    try:
        if path.suffix.lower() in {".parquet", ".pq"}:
            df = pd.read_parquet(path)
        else:
            df = pd.read_csv(path, encoding="utf-8-sig")
    except Exception as exc:
        raise DataError(path, f"cannot read as {'Parquet' if path.suffix.lower() in {'.parquet', '.pq'} else 'CSV'}: {exc}") from exc
    need = list(REQUIRED) + (list(config_cols) if config_cols else ["config"])
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise DataError(path, f"missing column(s) {missing}; found {list(df.columns)}"
                        + ("" if config_cols else " (or pass --config-cols with axis column names)"))
    if config_cols:
        df = df.copy()
        df["config"] = df[list(config_cols)].astype(str).agg("-".join, axis=1)
    df = df[["model", "benchmark", "config", "score"]].copy()
    for col in ("model", "benchmark", "config"):
        if df[col].isna().any():
            rows = (df.index[df[col].isna()] + 2).tolist()[:10]
            raise DataError(path, f"empty '{col}' in row(s) {rows} (row numbers count the header as 1)")
        df[col] = df[col].astype(str)
    num = pd.to_numeric(df["score"], errors="coerce")
    bad = num.isna() | ~num.apply(lambda v: pd.notna(v) and abs(v) != float("inf"))
    if bad.any():
        rows = (df.index[bad] + 2).tolist()[:10]
        vals = df.loc[bad, "score"].astype(str).tolist()[:10]
        raise DataError(path, f"non-numeric, NaN or infinite score in row(s) {rows}: {vals}")
    df["score"] = num.astype(float)
    dup = df.duplicated(["model", "benchmark", "config"], keep=False)
    if dup.any():
        d = df[dup].sort_values(["benchmark", "config", "model"])
        keys = sorted({f"({r.model}, {r.benchmark}, {r.config})" for r in d.itertuples()})
        raise DataError(path, f"duplicate (model, benchmark, config) rows: {', '.join(keys[:10])}"
                        + (f" and {len(keys) - 10} more" if len(keys) > 10 else ""))
    return df


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


def certify(path: str | Path, config_cols: list[str] | None = None, drop_incomplete: bool = False,
            tol: float | None = None) -> CertifyResult:
    """Verdict metrics of an external config-level table. Scores are floats, so with no
    ``tol`` values equal within 1e-12 relative tie; ``tol > 0``: |difference| <= tol ties, for
    every quantity (sign counts, orderings, tau_R)."""
    if tol is not None and (not tol >= 0 or tol == float("inf")):
        raise DataError(path, f"--tol must be a finite number >= 0 (got {tol})")
    df = read_score_table(path, config_cols)
    missing = incomplete_cells(df)
    dropped: dict = {}
    if missing:
        if not drop_incomplete:
            lines = [f"  {b}: " + ", ".join(f"{m} @ {c}" for m, c in cells[:20])
                     + (f" ... ({len(cells)} in all)" if len(cells) > 20 else "")
                     for b, cells in sorted(missing.items())]
            raise DataError(path, "configs present for some models but not others; missing cells:\n"
                            + "\n".join(lines) + "\n(--drop-incomplete drops those configs for every model)")
        for b, cells in missing.items():
            bad_cfgs = sorted({c for _, c in cells})
            dropped[b] = bad_cfgs
            df = df[~((df["benchmark"] == b) & (df["config"].isin(bad_cfgs)))]
    for b, sub in df.groupby("benchmark"):
        if sub["model"].nunique() < 2:
            raise DataError(path, f"benchmark {b!r} has fewer than two models after validation")
    if df.empty:
        raise DataError(path, "no complete configs left")
    return CertifyResult(pairwise_table(df, tol=tol), benchmark_summary(df, tol=tol), dropped, str(path),
                         tie_rule(tol, exact=False))


def to_json(res: CertifyResult) -> str:
    return json.dumps({
        "source": res.source,
        "tie_rule": res.tie_rule.as_dict(),
        "dropped_configs": res.dropped_configs,
        "pairs": json.loads(res.pairs.to_json(orient="records")),
        "benchmarks": json.loads(res.summary.to_json(orient="records")),
    }, indent=2)


def to_text(res: CertifyResult) -> str:
    out = [f"ties: {res.tie_rule.describe()}"]
    if res.dropped_configs:
        n = sum(len(v) for v in res.dropped_configs.values())
        out.append(f"dropped {n} incomplete config(s): "
                   + "; ".join(f"{b}: {len(v)}" for b, v in sorted(res.dropped_configs.items())))
    p = res.pairs.copy()
    p["rho_flip"] = p["rho_flip"].map("{:.3f}".format)
    p["ceiling"] = p["ceiling"].map("{:.3f}".format)
    out.append("Pairwise verdict stability (N+ counts configs where model_a scores higher)")
    out.append(p.to_string(index=False))
    s = res.summary.copy()
    s["max_rho_flip"] = s["max_rho_flip"].map("{:.3f}".format)
    s["tau_r"] = s["tau_r"].map("{:.3f}".format)
    s["orderings"] = s["orderings_reachable"].astype(str) + " of " + s["orderings_possible"].astype(str)
    out.append("")
    out.append("Per benchmark")
    out.append(s[["benchmark", "n_models", "n_configs", "max_rho_flip", "max_pair", "orderings",
                  "tied_configs", "tau_r"]].to_string(index=False))
    return "\n".join(out)
