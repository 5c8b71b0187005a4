"""The nearest reversing configuration: how far from the nominal configuration must one move
before the verdict "A vs B" reverses? (docs/VERDICTS.md section 3)

The distance between two configs is the number of axes whose level differs. The nominal
verdict is the strict sign of s_A - s_B at ``analysis.nominal_config``; where that config is
not in the set (CrowS-Pairs has no free-form path) its unique nearest config stands in, and
with several equally near there is no reference (:func:`resolve_nominal`). A tie at the nominal
is no verdict. Per pair: the nearest config where the other model is strictly ahead, and, with
item-level input, where it is significantly ahead (:mod:`.significance`, Holm over the pair's
configs); "none within the envelope" when nothing reverses.
"""

from __future__ import annotations

import itertools
from typing import Iterable, Mapping, Sequence

import pandas as pd

from .compare import diff_sign, score_grid

AXES = ("template", "decoding", "shots", "scoring")
NONE_TEXT = "none within the envelope"
NO_SIG_TEXT = "not computed: needs item-level significance (item results)"
NO_SIG_BENCH_TEXT = "not computed: the significance analysis has no rows for this pair (benchmark skipped there)"

REVERSAL_COLUMNS = ["benchmark", "model_a", "model_b", "pair", "n_configs", "nominal_config",
                    "nominal_used", "nominal_leader", "nominal_sign", "strict_distance", "strict_configs",
                    "strict_axes", "n_strict_reversing", "strict_result", "sig_distance", "sig_configs",
                    "sig_axes", "n_sig_reversing", "sig_result", "note"]


def changed_axes(a: Mapping[str, str], b: Mapping[str, str], axes: Sequence[str] = AXES) -> tuple[str, ...]:
    """The axes whose level differs between two configs (their count is the axis distance)."""
    return tuple(x for x in axes if str(a[x]) != str(b[x]))


def nearest(levels: Mapping[str, Mapping[str, str]], start: str, hits: Iterable[str],
            axes: Sequence[str] = AXES) -> tuple[int | None, list[str], list[tuple[str, ...]]]:
    """(distance, configs at that distance sorted, their changed axes) from ``start`` to the
    nearest of ``hits``; (None, [], []) when ``hits`` is empty."""
    found = sorted((len(changed_axes(levels[start], levels[c], axes)), c) for c in hits)
    if not found:
        return None, [], []
    d = found[0][0]
    cfgs = [c for dist, c in found if dist == d]
    return d, cfgs, [changed_axes(levels[start], levels[c], axes) for c in cfgs]


def resolve_nominal(levels: Mapping[str, Mapping[str, str]], nominal: str, nominal_levels: Mapping[str, str],
                    axes: Sequence[str] = AXES) -> tuple[str | None, str]:
    """(config standing for the nominal in this config set, note): the nominal itself, else its
    unique nearest config, else None (no config, or several equally near)."""
    if nominal in levels:
        return nominal, ""
    dists = sorted((len(changed_axes(nominal_levels, lv, axes)), c) for c, lv in levels.items())
    if not dists:
        return None, "no configs"
    best = [c for d, c in dists if d == dists[0][0]]
    if len(best) == 1:
        return best[0], (f"nominal {nominal} is not in this benchmark's envelope; its nearest valid config "
                         f"{best[0]} ({dists[0][0]} axis change(s)) is the reference")
    return None, (f"nominal {nominal} is not in this benchmark's envelope and {len(best)} configs are equally "
                  f"near ({', '.join(best[:4])}{', ...' if len(best) > 4 else ''}): no reference verdict")


def _describe(d: int | None, cfgs: list[str], axes_changed: list[tuple[str, ...]]) -> str:
    if d is None:
        return NONE_TEXT
    where = "; ".join(f"{c} ({', '.join(a) or 'no axis'})" for c, a in zip(cfgs, axes_changed))
    return f"{d} axis change{'' if d == 1 else 's'}: {where}"


def pair_reversal(levels: Mapping[str, Mapping[str, str]], signs: Mapping[str, int], nominal: str,
                  nominal_levels: Mapping[str, str], model_a: str, model_b: str,
                  sig_signs: Mapping[str, int] | None = None, axes: Sequence[str] = AXES) -> dict:
    """One row of the nearest-reversal table for one pair.

    ``signs``: config -> +1 (A strictly ahead), -1 (B strictly ahead) or 0 (tie) over C;
    ``sig_signs``: the same for "significantly ahead", or None when not available."""
    used, note = resolve_nominal(levels, nominal, nominal_levels, axes)
    row = {"model_a": model_a, "model_b": model_b, "pair": f"{model_a} vs {model_b}", "n_configs": len(levels),
           "nominal_config": nominal, "nominal_used": used or "", "nominal_leader": "", "nominal_sign": 0,
           "strict_distance": None, "strict_configs": "", "strict_axes": "", "n_strict_reversing": 0,
           "strict_result": "", "sig_distance": None, "sig_configs": "", "sig_axes": "", "n_sig_reversing": 0,
           "sig_result": "" if sig_signs is not None else NO_SIG_TEXT, "note": note}
    if used is None:
        row["strict_result"] = "no reference config"
        if sig_signs is not None:
            row["sig_result"] = "no reference config"
        return row
    s0 = int(signs[used])
    row["nominal_sign"] = s0
    row["nominal_leader"] = model_a if s0 > 0 else model_b if s0 < 0 else "tie"
    if s0 == 0:
        row["strict_result"] = "tied at the nominal config: no verdict to reverse"
        if sig_signs is not None:
            row["sig_result"] = row["strict_result"]
        return row
    targets = [c for c in levels if int(signs[c]) == -s0]
    d, cfgs, ax = nearest(levels, used, targets, axes)
    row.update(strict_distance=d, strict_configs=";".join(cfgs), strict_axes=";".join("+".join(a) for a in ax),
               n_strict_reversing=len(targets), strict_result=_describe(d, cfgs, ax))
    if sig_signs is not None:
        missing = [c for c in levels if c not in sig_signs]
        if missing:
            raise ValueError(f"significance signs lack config(s) {missing[:5]} for {model_a} vs {model_b}")
        sig_targets = [c for c in levels if int(sig_signs[c]) == -s0]
        d, cfgs, ax = nearest(levels, used, sig_targets, axes)
        row.update(sig_distance=d, sig_configs=";".join(cfgs), sig_axes=";".join("+".join(a) for a in ax),
                   n_sig_reversing=len(sig_targets), sig_result=_describe(d, cfgs, ax))
    return row


def reversal_line(row: Mapping) -> str:
    """The report's and certify's one-line summary of a nearest-reversal row."""
    lead = row["nominal_leader"]
    head = f"{row['benchmark']}, {row['pair']}: "
    if not row["nominal_used"]:
        return head + str(row["note"])
    at = row["nominal_used"]
    verdict = f"tied at {at}" if lead == "tie" else f"{lead} ahead at {at}"
    if row["nominal_used"] != row["nominal_config"]:
        verdict += f" (standing in for {row['nominal_config']})"
    return (head + f"{verdict}; nearest strict reversal: {row['strict_result']}; "
            f"nearest significant reversal: {row['sig_result']}")


def sig_signs_from_configs(sig_configs: pd.DataFrame) -> dict[tuple[str, str, str], dict[str, int]]:
    """(benchmark, A, B) -> config -> +1 (A significantly ahead), -1 (B), 0 (neither), from the
    ``significance_configs`` table (its ``ahead`` column names the significantly leading model)."""
    need = ["benchmark", "model_a", "model_b", "config", "ahead"]
    missing = [c for c in need if c not in sig_configs.columns]
    if missing:
        raise ValueError(f"significance_configs lacks column(s) {missing}")
    out: dict[tuple[str, str, str], dict[str, int]] = {}
    for r in sig_configs[need].itertuples(index=False):
        ahead = "" if r.ahead is None or (isinstance(r.ahead, float) and pd.isna(r.ahead)) else str(r.ahead)
        if ahead not in ("", r.model_a, r.model_b):
            raise ValueError(f"significance_configs: 'ahead' = {ahead!r} is neither model of "
                             f"({r.benchmark}, {r.model_a} vs {r.model_b}, {r.config})")
        out.setdefault((r.benchmark, r.model_a, r.model_b), {})[r.config] = (
            1 if ahead == r.model_a else -1 if ahead == r.model_b else 0)
    return out


def nearest_reversal_table(df: pd.DataFrame, nominal: str, axes: Sequence[str] = AXES, tol: float | None = None,
                           sig_signs: Mapping[tuple[str, str, str], Mapping[str, int]] | None = None,
                           nominal_levels: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Per benchmark and model pair (A < B by name) over the configs of ``df`` (columns model,
    benchmark, config, score and the ``axes`` columns; complete configs only).

    ``nominal_levels``: the nominal config's level per axis (default: read from any row of
    ``df`` with that config id). ``sig_signs``: (benchmark, A, B) -> config -> +1/-1/0 for
    "significantly ahead"; None leaves the significant part uncomputed (said in the rows)."""
    axes = list(axes)
    missing = [a for a in axes if a not in df.columns]
    if missing:
        raise ValueError(f"the nearest reversing configuration needs axis columns; missing {missing}")
    if nominal_levels is None:
        hit = df[df["config"] == nominal]
        if hit.empty:
            raise ValueError(f"nominal config {nominal!r} is in no benchmark of the table; give its axis levels")
        nominal_levels = {a: str(hit.iloc[0][a]) for a in axes}
    rows = []
    for b in sorted(df["benchmark"].unique()):
        sub = df[df["benchmark"] == b]
        first = sub.drop_duplicates("config").set_index("config")
        levels = {c: {a: str(first.at[c, a]) for a in axes} for c in first.index}
        g = score_grid(sub)
        for a, m in itertools.combinations(g.models, 2):
            signs = dict(zip(g.configs, diff_sign(g.column(a), g.column(m), tol)))
            sig = None if sig_signs is None else sig_signs.get((b, a, m))
            row = {"benchmark": b, **pair_reversal(levels, signs, nominal, nominal_levels, a, m, sig, axes)}
            if sig_signs is not None and sig is None:
                row["sig_result"] = NO_SIG_BENCH_TEXT
            rows.append(row)
    out = pd.DataFrame(rows, columns=REVERSAL_COLUMNS)
    for col in ("strict_distance", "sig_distance"):
        out[col] = out[col].astype("Int64")
    return out
