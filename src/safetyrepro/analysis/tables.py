"""The paper's tables from the cell-score table, built on :mod:`safetyrepro.metrics`.

Tables 2 (full envelope), 3 (per scoring slice; ``freeform_greedy`` is the free-form slice
matched to logprob, which exists only under greedy) and 4 (the envelopes of
:func:`table4_envelopes`), parse-clean configs, tau_R with the order change rate, the nearest
reversing configuration and a bootstrap over configurations (:func:`bootstrap_rho`). Pairs are
(A, B) with A < B by name; configs missing a cell for some model are dropped first.
"""

from __future__ import annotations

import itertools
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from ..grid import Config
from ..metrics import benchmark_summary, nearest_reversal_table, orderings, pairwise_table, score_grid
from ..metrics.compare import diff_sign, has_exact, tie_rule
from ..metrics.itemgrid import grids_for
from ..metrics.resampling import DEFAULT_SAMPLES
from ..metrics.reversal import sig_signs_from_configs
from ..metrics.significance import noise_columns
from ..rules import Rules, load_rules
from .common import (AXES, NOMINAL_CONFIG, check_rules_file, check_same_rules, load_cell_scores, load_item_results,
                     optional_source, output_metadata, pair_label, write_tables)

SUMMARY_KEEP = ["benchmark", "max_rho_flip", "max_pair", "orderings_reachable", "orderings_possible"]
SLICES = {
    "freeform": lambda d: d["scoring"] == "freeform",
    "logprob": lambda d: d["scoring"] == "logprob",
    "freeform_greedy": lambda d: (d["scoring"] == "freeform") & (d["decoding"] == "greedy"),
}
SLICE_NOTES = {
    "freeform": "spans every decoding; logprob exists only under greedy, so this slice and the "
                "logprob slice are not matched on decoding support",
    "logprob": "greedy only (log-likelihood scoring has no decoding); not matched on decoding "
               "support with the full free-form slice",
    "freeform_greedy": "free-form restricted to greedy: matched to the logprob slice on decoding support",
}


FLIP_SUMMARY_COLUMNS = ["benchmark", "n_models", "n_configs", "max_rho_flip", "max_pair",
                        "orderings_reachable", "orderings_possible", "tied_configs"]


def flip_summary(df: pd.DataFrame, tol: float = 0.0, pairs: pd.DataFrame | None = None) -> pd.DataFrame:
    """:func:`safetyrepro.metrics.benchmark_summary` without tau_R (whose O(|C|^2) Kendall taus
    dominate the run time and are only needed for the tau_R table); same columns and values."""
    pairs = pairwise_table(df, tol=tol) if pairs is None else pairs
    rows = []
    for b in sorted(df["benchmark"].unique()):
        g = score_grid(df, b)
        if g.empty:
            continue
        ords = orderings(g.columns(), tol)
        pb = pairs[pairs["benchmark"] == b]
        if len(pb):
            best = pb.loc[pb["rho_flip"].idxmax()]
            max_rho, max_pair = float(best["rho_flip"]), pair_label(best["model_a"], best["model_b"])
        else:
            max_rho, max_pair = float("nan"), ""
        rows.append({"benchmark": b, "n_models": len(g.models), "n_configs": len(g.configs),
                     "max_rho_flip": max_rho, "max_pair": max_pair, "orderings_reachable": ords["reachable"],
                     "orderings_possible": ords["possible"], "tied_configs": ords["tied_configs"]})
    return pd.DataFrame(rows, columns=FLIP_SUMMARY_COLUMNS)


def _with_summary(df: pd.DataFrame, tol: float) -> pd.DataFrame:
    """pairwise_table rows + the per-benchmark max and orderings columns."""
    pairs = pairwise_table(df, tol=tol)
    summ = flip_summary(df, tol, pairs)[SUMMARY_KEEP]
    pairs.insert(1, "pair", [pair_label(a, b) for a, b in zip(pairs["model_a"], pairs["model_b"])])
    return pairs.merge(summ, on="benchmark", how="left")


PAIR_NOISE = ["rho_flip_null_mean", "rho_flip_null_q95", "rho_flip_null_p"]
BENCH_NOISE = ["max_rho_flip_null_mean", "max_rho_flip_null_q95", "max_rho_flip_null_p",
               "orderings_null_mean", "orderings_null_q95", "orderings_null_p"]
NO_NOISE = "no item-level noise reference (cell score is not a mean over items, or no item results)"


@dataclass
class Noise:
    """Item grids and resampling settings for the noise columns (docs/VERDICTS.md)."""

    grids: dict                    # benchmark -> ItemGrid (restricted to the cell table's configs)
    samples: int = DEFAULT_SAMPLES
    seed: int = 0
    skipped: dict = None           # benchmark -> why it has no noise reference
    # (benchmark, configs, tol) -> its (pair, benchmark) rows: Tables 2 and 4, parse-clean and the
    # bootstrap ask for the full envelope's references several times
    _done: dict = field(default_factory=dict, repr=False)

    def columns(self, df: pd.DataFrame, tol) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(pair, benchmark) noise columns over the configs present in ``df``."""
        parts = []
        for b, g in self.grids.items():
            cfgs = frozenset(df.loc[df["benchmark"] == b, "config"])
            if cfgs:
                key = (b, cfgs, tol)
                if key not in self._done:
                    self._done[key] = noise_columns([g.restrict(cfgs)], self.samples, self.seed, tol)
                parts.append(self._done[key])
        pairs = pd.concat([x[0] for x in parts], ignore_index=True) if parts else pd.DataFrame()
        bench = pd.concat([x[1] for x in parts], ignore_index=True) if parts else pd.DataFrame()
        if pairs.empty:
            pairs = pd.DataFrame(columns=["benchmark", "model_a", "model_b", *PAIR_NOISE])
        if bench.empty:
            bench = pd.DataFrame(columns=["benchmark", *BENCH_NOISE])
        return pairs, bench


def _with_noise(out: pd.DataFrame, df: pd.DataFrame, noise: "Noise | None", tol, pair_level: bool) -> pd.DataFrame:
    if noise is None:
        return out
    pairs, bench = noise.columns(df, tol)
    if pair_level:
        out = out.merge(pairs, on=["benchmark", "model_a", "model_b"], how="left")
    keep = ["benchmark"] + [c for c in BENCH_NOISE if c in bench.columns]
    out = out.merge(bench[keep], on="benchmark", how="left")
    out["noise_note"] = np.where(out["benchmark"].isin(list(noise.grids)), "", NO_NOISE)
    return out


def table2(df: pd.DataFrame, tol: float = 0.0, noise: Noise | None = None) -> pd.DataFrame:
    out = _with_summary(df, tol)
    out.insert(1, "envelope", "full")
    return _with_noise(out, df, noise, tol, pair_level=True)


def _support(df: pd.DataFrame, col: str) -> dict[str, str]:
    return {b: ",".join(sorted(s[col].unique())) for b, s in df.groupby("benchmark")}


def table3(df: pd.DataFrame, tol: float = 0.0, noise: Noise | None = None) -> pd.DataFrame:
    parts = []
    for name, mask in SLICES.items():
        sub = df[mask(df)]
        if sub.empty:
            continue
        t = _with_noise(_with_summary(sub, tol), sub, noise, tol, pair_level=True)
        t.insert(1, "slice", name)
        sup = _support(sub, "decoding")
        t["decoding_support"] = t["benchmark"].map(sup)
        t["matched_to_logprob_decoding"] = t["decoding_support"] == "greedy"
        t["note"] = SLICE_NOTES[name]
        parts.append(t)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _summary_rows(df: pd.DataFrame, label_col: str, label: str, tol: float, with_tau: bool = False) -> pd.DataFrame:
    s = benchmark_summary(df, tol=tol) if with_tau else flip_summary(df, tol)
    s.insert(1, label_col, label)
    return s


def _sort_envelopes(out: pd.DataFrame, order: list[str] | None = None) -> pd.DataFrame:
    order = order or ["full", "core"]
    rank = out["envelope"].map({e: i for i, e in enumerate(order)})
    return out.assign(_r=rank).sort_values(["benchmark", "_r"]).drop(columns="_r").reset_index(drop=True)


def table4_envelopes(rules: Rules) -> list[tuple[str, str, callable]]:
    """(label, description, predicate on a config's axis levels) for Table 4's rows, in order:
    full, core, full minus each stress-tier level (one at a time), then every other named
    sub-envelope of the rules (``conservative_core``)."""
    envs = [("full", "every valid config", lambda lv: True)]
    if "core" in rules.sub_envelope_names:
        envs.append(("core", rules.sub_envelope("core").get("description", "core"),
                     lambda lv: rules.in_sub_envelope("core", lv)))
    for axis in AXES:
        for level in rules.levels(axis):
            if level["tier"] == "stress":
                envs.append((f"full minus {level['id']}", f"every valid config except {axis} {level['id']}",
                             lambda lv, a=axis, i=level["id"]: lv[a] != i))
    for name in rules.sub_envelope_names:
        if name not in ("full", "core"):
            envs.append((name, " ".join(str(rules.sub_envelope(name).get("description", name)).split()),
                         lambda lv, n=name: rules.in_sub_envelope(n, lv)))
    return envs


TABLE4_COLUMNS = ["benchmark", "envelope", "n_configs", "max_rho_flip", "max_pair", "orderings_reachable",
                  "orderings_possible", "tied_configs", "envelope_definition", "note"]


def table4(df: pd.DataFrame, tol: float = 0.0, rules: Rules | None = None, noise: Noise | None = None) -> pd.DataFrame:
    """Table 4 as the paper has it: one row per benchmark and envelope of
    :func:`table4_envelopes` (``rules`` default: the project's envelope rules). A benchmark
    with no config in an envelope (CrowS-Pairs in the free-form-only conservative core) gets
    a row with |C| = 0, no values and a note."""
    rules = rules or load_rules()
    envs = table4_envelopes(rules)
    levels = df[list(AXES)].astype(str).to_dict("records")
    benches = sorted(df["benchmark"].unique())
    n_models = df.groupby("benchmark")["model"].nunique()
    parts = []
    for label, desc, pred in envs:
        mask = np.fromiter((pred(lv) for lv in levels), dtype=bool, count=len(levels))
        sub = df[mask]
        s = flip_summary(sub, tol) if not sub.empty else pd.DataFrame(columns=FLIP_SUMMARY_COLUMNS)
        s = s.set_index("benchmark").reindex(benches).reset_index()
        empty = s["n_configs"].isna().to_numpy()
        if empty.any():
            s = s.astype({"max_pair": object})
            for i in np.flatnonzero(empty):
                s.loc[i, ["n_configs", "orderings_reachable", "tied_configs"]] = 0
                s.loc[i, "max_pair"] = ""
                s.loc[i, "orderings_possible"] = math.factorial(int(n_models[s.loc[i, "benchmark"]]))
        s["note"] = np.where(empty, "no config of this benchmark in this envelope", "")
        s.insert(1, "envelope", label)
        s["envelope_definition"] = desc
        if noise is not None:
            s = _with_noise(s, sub, noise, tol, pair_level=False)
        parts.append(s)
    cols = TABLE4_COLUMNS + ([c for c in BENCH_NOISE] + ["noise_note"] if noise is not None else [])
    out = pd.concat(parts, ignore_index=True).reindex(columns=cols)
    for col in ("n_configs", "orderings_reachable", "orderings_possible", "tied_configs"):
        out[col] = out[col].astype(int)
    out["max_rho_flip"] = out["max_rho_flip"].astype(float)
    return _sort_envelopes(out, [e[0] for e in envs])


def parse_clean(df: pd.DataFrame, threshold: float = 0.95, tol: float = 0.0, noise: Noise | None = None) -> pd.DataFrame:
    """Per benchmark: the flip summary over configs where min parse rate over models >= threshold
    (with ``noise``: the noise references on those configs)."""
    worst = df.groupby(["benchmark", "config"])["parse_rate"].min()
    clean = set(worst[worst >= threshold].index)
    keep = np.array([(b, c) in clean for b, c in zip(df["benchmark"], df["config"])], dtype=bool)
    full = flip_summary(df, tol).set_index("benchmark")
    left = flip_summary(df[keep], tol).set_index("benchmark") if keep.any() else None
    rows = []
    for b in sorted(df["benchmark"].unique()):
        row = {"benchmark": b, "threshold": float(threshold),
               "n_configs_total": int(full.loc[b, "n_configs"]),
               "max_rho_flip_full": float(full.loc[b, "max_rho_flip"])}
        if left is not None and b in left.index:
            s = left.loc[b]
            row.update(n_configs_left=int(s["n_configs"]), max_rho_flip=float(s["max_rho_flip"]),
                       max_pair=str(s["max_pair"]), orderings_reachable=int(s["orderings_reachable"]),
                       orderings_possible=int(s["orderings_possible"]), note="")
        else:
            row.update(n_configs_left=0, max_rho_flip=float("nan"), max_pair="",
                       orderings_reachable=0, orderings_possible=int(full.loc[b, "orderings_possible"]),
                       note=f"no config has every model's parse rate >= {threshold}")
        row["n_configs_dropped"] = row["n_configs_total"] - row["n_configs_left"]
        rows.append(row)
    cols = ["benchmark", "threshold", "n_configs_total", "n_configs_left", "n_configs_dropped",
            "max_rho_flip", "max_pair", "orderings_reachable", "orderings_possible",
            "max_rho_flip_full", "note"]
    out = pd.DataFrame(rows, columns=cols)
    return _with_noise(out, df[keep], noise, tol, pair_level=False) if noise is not None else out


def tau_r_table(df: pd.DataFrame, tol: float = 0.0) -> pd.DataFrame:
    keep = ["benchmark", "envelope", "n_configs", "tau_r", "tau_pairs_used", "tau_pairs_undefined",
            "order_change_rate", "order_change_null"]
    parts = [_summary_rows(df, "envelope", "full", tol, with_tau=True)]
    if df["core"].any():
        parts.append(_summary_rows(df[df["core"]], "envelope", "core", tol, with_tau=True))
    return _sort_envelopes(pd.concat(parts, ignore_index=True)[keep])


def benchmark_rng(seed: int, benchmark: str) -> np.random.Generator:
    """Independent stream per benchmark, so a benchmark's interval does not depend on which
    other benchmarks are in the table."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), zlib.crc32(benchmark.encode())]))


def bootstrap_rho(df: pd.DataFrame, samples: int = 1000, seed: int = 0, tol: float = 0.0,
                  progress: bool = False, noise: Noise | None = None) -> pd.DataFrame:
    """Percentile bootstrap over configurations: |C| configs drawn with replacement per
    benchmark, rho_flip per pair and their max recomputed, interval (2.5, 97.5; numpy's linear
    interpolation) around the estimate on the observed configs. With ``noise``, each row's
    noise reference (rho_flip_null_*, max_rho_flip_null_*) beside it."""
    if samples < 1:
        raise ValueError("bootstrap samples must be >= 1")
    rows = []
    benches = sorted(df["benchmark"].unique())
    for b in tqdm(benches, desc="bootstrap", disable=not progress):
        g = score_grid(df, b)
        n = len(g.configs)
        pairs = list(itertools.combinations(g.models, 2))
        if not pairs:
            continue
        cols = g.columns()
        idx = benchmark_rng(seed, b).integers(0, n, size=(samples, n))
        boot = np.empty((samples, len(pairs)))
        point = np.empty(len(pairs))
        for j, (a, m) in enumerate(pairs):
            sign = diff_sign(cols[a], cols[m], tol)          # the tie rule of metrics.compare
            point[j] = min(np.sum(sign > 0), np.sum(sign < 0)) / n
            drawn = sign[idx]
            boot[:, j] = np.minimum((drawn > 0).sum(axis=1), (drawn < 0).sum(axis=1)) / n
        stats = [(pair_label(a, m), a, m, point[j], boot[:, j]) for j, (a, m) in enumerate(pairs)]
        stats.append(("max", "", "", point.max(), boot.max(axis=1)))
        for label, a, m, est, dist in stats:
            lo, hi = np.percentile(dist, [2.5, 97.5])
            rows.append({"benchmark": b, "statistic": label, "model_a": a, "model_b": m,
                         "resamples": "configurations", "n_configs": n, "estimate": float(est), "ci_low": float(lo), "ci_high": float(hi),
                         "boot_mean": float(dist.mean()), "samples": int(samples), "seed": int(seed)})
    out = pd.DataFrame(rows, columns=["benchmark", "statistic", "model_a", "model_b", "resamples", "n_configs",
                                      "estimate", "ci_low", "ci_high", "boot_mean", "samples", "seed"])
    if noise is None:
        return out
    pairs, bench = noise.columns(df, tol)
    out = out.merge(pairs, on=["benchmark", "model_a", "model_b"], how="left")
    mx = bench.set_index("benchmark") if len(bench) else None
    for c in ("null_mean", "null_q95", "null_p"):
        col = f"rho_flip_{c}"
        if mx is not None:
            is_max = out["statistic"] == "max"
            out.loc[is_max, col] = out.loc[is_max, "benchmark"].map(mx[f"max_rho_flip_{c}"])
    out["noise_note"] = np.where(out["benchmark"].isin(list(noise.grids)), "", NO_NOISE)
    return out


def nearest_reversal(df: pd.DataFrame, nominal: str = NOMINAL_CONFIG, tol: float | None = None,
                     sig_configs: pd.DataFrame | None = None) -> pd.DataFrame:
    """The nearest reversing configuration per benchmark and pair over the full envelope
    (:func:`safetyrepro.metrics.reversal.nearest_reversal_table`); ``sig_configs``: the
    ``significance_configs`` table of the item-level significance analysis, or None (the
    significant part then says it was not computed)."""
    try:
        nominal_levels = Config.parse(nominal).levels()
    except ValueError as exc:
        raise ValueError(f"analysis.nominal_config: {exc}") from None
    sig = None if sig_configs is None else sig_signs_from_configs(sig_configs)
    return nearest_reversal_table(df, nominal, AXES, tol, sig_signs=sig, nominal_levels=nominal_levels)


def paper_tables(df: pd.DataFrame, *, threshold: float = 0.95, bootstrap_samples: int = 1000,
                 bootstrap_seed: int = 0, tol: float = 0.0, progress: bool = False,
                 rules: Rules | None = None, noise: Noise | None = None) -> dict[str, pd.DataFrame]:
    """Every paper table; with ``noise`` (item grids), Table 2 and Table 4 carry the noise
    references beside rho_flip and the orderings."""
    return {
        "table2": table2(df, tol, noise),
        "table3": table3(df, tol, noise),
        "table4": table4(df, tol, rules, noise),
        "parse_clean": parse_clean(df, threshold, tol, noise),
        "tau_r": tau_r_table(df, tol),
        "bootstrap": bootstrap_rho(df, bootstrap_samples, bootstrap_seed, tol, progress, noise),
    }


def write_paper_tables(cell_scores_path: str | Path, out_dir: str | Path, *, threshold: float = 0.95,
                       bootstrap_samples: int = 1000, bootstrap_seed: int = 0,
                       tol: float = 0.0, rules_path: str | Path | None = None,
                       item_results_path: str | Path | None = None,
                       noise_samples: int | None = None) -> dict[str, Path]:
    """Compute every paper table from ``cell_scores.parquet`` and write each as
    ``<out_dir>/<name>.parquet`` + ``.csv``. Returns name -> path (``<name>_csv`` for CSVs).
    ``rules_path``: the envelope rules the run used (default config/envelope.yaml), for
    Table 4's envelopes; its stamp must match the table's. ``item_results_path``: the run's
    item results, for the noise columns of Tables 2 and 4 (``noise_samples`` draws; default
    resampling.DEFAULT_SAMPLES, seed ``bootstrap_seed``)."""
    cs = load_cell_scores(cell_scores_path)
    rules = load_rules(rules_path)
    check_rules_file(rules, cs.path, cs.meta)
    sources = [(cs.path, cs.meta)]
    noise = None
    if item_results_path is not None:
        noise, ipath, imeta = _noise_for(cs, item_results_path, noise_samples or DEFAULT_SAMPLES, bootstrap_seed)
        sources.append((ipath, imeta))
    params = {"threshold": threshold, "bootstrap_samples": bootstrap_samples,
              "bootstrap_seed": bootstrap_seed, "tol": tol, "rules": rules.path,
              "tie_rule": tie_rule(tol, exact=has_exact(cs.df)).as_dict(),
              "noise": None if noise is None else {"samples": noise.samples, "seed": noise.seed,
                                                   "benchmarks": sorted(noise.grids), "skipped": noise.skipped,
                                                   "resamples": "item-wise sign flips (pairs), model permutations "
                                                                "within items (benchmark max, orderings)"}}
    tables = paper_tables(cs.df, threshold=threshold, bootstrap_samples=bootstrap_samples,
                          bootstrap_seed=bootstrap_seed, tol=tol, progress=True, rules=rules, noise=noise)
    return write_tables("tables", tables, out_dir, lambda name: output_metadata(
        name, sources, params, {"dropped_incomplete_configs": cs.dropped}))


def _noise_for(cs, item_results_path, samples: int, seed: int) -> tuple[Noise, Path, dict]:
    """Item grids of the benchmarks whose cell score is an item mean, checked against the cells."""
    ipath = Path(item_results_path)
    results, imeta = load_item_results(ipath, ["model", "benchmark", "config", "seed", "item_id", "correct"])
    check_same_rules((cs.path, cs.meta), (ipath, imeta))
    skipped: dict = {}
    grids = grids_for(cs.df, results, str(ipath), skipped)
    return Noise({g.benchmark: g for g in grids}, samples, seed, skipped), ipath, imeta


def write_nearest_reversal(cell_scores_path: str | Path, out_dir: str | Path, nominal: str = NOMINAL_CONFIG,
                           significance_configs_path: str | Path | None = None,
                           tol: float | None = None) -> dict[str, Path]:
    """``nearest_reversal`` from ``cell_scores.parquet`` and, when given, the item-level
    ``significance_configs.parquet`` of the same run (for the significant reversals)."""
    cs = load_cell_scores(cell_scores_path)
    sources = [(cs.path, cs.meta)]
    sig = optional_source(significance_configs_path, cs, sources)
    table = nearest_reversal(cs.df, nominal, tol, sig)
    params = {"nominal_config": nominal, "tol": tol, "tie_rule": tie_rule(tol, exact=has_exact(cs.df)).as_dict(),
              "significance": "significance_configs (family-wise corrected per-config tests)" if sig is not None
              else "not computed (no item-level significance given)"}
    return write_tables("nearest-reversal", {"nearest_reversal": table}, out_dir, lambda name: output_metadata(
        name, sources, params, {"dropped_incomplete_configs": cs.dropped}))
