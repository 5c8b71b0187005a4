"""Benchmark 13: calibration of the item-level verdicts (docs/VERDICTS.md section 2).

Simulated item tables with known truth, run through `significance_tables` as certify runs it:

* null: two models draw every item outcome from the same per-(config, item) success
  probability p ~ U(0.2, 0.8) (0/1 items, or 5-seed means k/5): exchangeable item by item;
* shift: A's probability is p + 0.10 on every config (no reversal exists);
* crossover: A's is p + 0.15 on half the configs and p - 0.15 on the other half.

Per (items n, item kind, configs |C|): the size of each test under the null (share of tables
with at least one significant config, a crossover, rho_flip_null_p <= alpha, max-T and Holm),
with its Monte-Carlo SE, and the power under the alternatives (any significant config under
shift, the crossover found under crossover). Writes benchmarks/results/calibration.json and
prints a Markdown table (docs/VERDICTS.md section 2.7).
Run: .venv/bin/python benchmarks/calibration.py [--reps 100] [--samples 999]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from safetyrepro.metrics.itemgrid import ItemGrid  # noqa: E402
from safetyrepro.metrics.significance import Settings, significance_tables  # noqa: E402

ITEMS = (3, 6, 12, 50, 300)
KINDS = {"binary": 1, "seed_mean5": 5}
CONFIGS = (4, 48, 360)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def table(rng, n: int, n_cfg: int, seeds: int, shift: np.ndarray) -> ItemGrid:
    p = rng.uniform(0.2, 0.8, size=(n_cfg, n))
    num = np.stack([rng.binomial(seeds, np.clip(p + shift[:, None], 0, 1)), rng.binomial(seeds, p)]).astype(np.int64)
    den = np.full((2, n_cfg), seeds, dtype=np.int64)
    return ItemGrid("sim", ["A", "B"], [f"c{c:03d}" for c in range(n_cfg)], [f"i{i:03d}" for i in range(n)],
                    num / den[:, :, None], num, den)


def run_case(n: int, kind: str, n_cfg: int, reps: int, samples: int, alpha: float, seed: int) -> dict:
    rng = np.random.default_rng([seed, n, KINDS[kind], n_cfg])
    seeds = KINDS[kind]
    half = np.where(np.arange(n_cfg) % 2 == 0, 0.15, -0.15)
    scen = {"null": np.zeros(n_cfg), "shift": np.full(n_cfg, 0.10), "crossover": half}
    counts = {k: 0 for k in ("fwer_maxt", "fwer_holm", "crossover_null", "rho_null", "power_shift",
                             "power_crossover")}
    t0 = time.perf_counter()
    for _ in range(reps):
        for name, shift in scen.items():
            g = table(rng, n, n_cfg, seeds, shift)
            sig = significance_tables([g], Settings(alpha=alpha, samples=samples))["significance"].iloc[0]
            any_sig = (sig["n_plus_sig"] + sig["n_minus_sig"]) > 0
            if name == "null":
                counts["fwer_maxt"] += any_sig
                counts["crossover_null"] += bool(sig["crossover"])
                counts["rho_null"] += sig["rho_flip_null_p"] <= alpha
                h = significance_tables([g], Settings(alpha=alpha, samples=samples, correction="holm"))
                r = h["significance"].iloc[0]
                counts["fwer_holm"] += (r["n_plus_sig"] + r["n_minus_sig"]) > 0
            elif name == "shift":
                counts["power_shift"] += any_sig
            else:
                counts["power_crossover"] += bool(sig["crossover"])
    row = {"n_items": n, "items": kind, "n_configs": n_cfg, "reps": reps, "samples": samples, "alpha": alpha,
           "seconds": round(time.perf_counter() - t0, 1)}
    for k, v in counts.items():
        rate = v / reps
        row[k] = rate
        row[k + "_se"] = float(np.sqrt(max(rate * (1 - rate), alpha * (1 - alpha)) / reps))
    row["size_ok"] = all(row[k] <= alpha + 3 * row[k + "_se"] for k in ("fwer_maxt", "fwer_holm", "crossover_null",
                                                                        "rho_null"))
    return row


def markdown(rows: list[dict]) -> str:
    head = ("| items | kind | configs | reps | size max-T | size Holm | false crossover | rho_flip_null_p <= a "
            "| power (shift 10 pp) | power (crossover +-15 pp) | within a + 3 SE |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lines.append(f"| {r['n_items']} | {r['items']} | {r['n_configs']} | {r['reps']} | {r['fwer_maxt']:.3f} | "
                     f"{r['fwer_holm']:.3f} | {r['crossover_null']:.3f} | {r['rho_null']:.3f} | "
                     f"{r['power_shift']:.2f} | {r['power_crossover']:.2f} | {'yes' if r['size_ok'] else 'NO'} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--reps-360", type=int, default=40, help="tables per case at 360 configs (the slow ones)")
    ap.add_argument("--samples", type=int, default=999)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "calibration.json")
    a = ap.parse_args()
    import subprocess

    # the revision whose code this process imported (read now: the checkout may move during the run)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "src"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    rows = []
    t0 = time.time()
    for n_cfg in CONFIGS:
        for n in ITEMS:
            for kind in KINDS:
                reps = a.reps_360 if n_cfg == 360 else a.reps
                rows.append(run_case(n, kind, n_cfg, reps, a.samples, a.alpha, a.seed))
                r = rows[-1]
                print(f"n={n} {kind} C={n_cfg}: size {r['fwer_maxt']:.3f} holm {r['fwer_holm']:.3f} "
                      f"cross {r['crossover_null']:.3f} rho {r['rho_null']:.3f} power {r['power_shift']:.2f}/"
                      f"{r['power_crossover']:.2f} ({r['seconds']} s)", flush=True)
    record = {"benchmark": "calibration", "command": " ".join(sys.argv), "code_revision": rev + ("+dirty" if dirty else ""),
              "cpu": cpu_name(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": round(time.time() - t0, 1),
              "settings": vars(a) | {"out": str(a.out)}, "rows": rows, "markdown": markdown(rows)}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(record, indent=2) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
