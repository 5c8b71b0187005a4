"""Benchmark 9: `safetyrepro certify` on synthetic tables of the sizes issues 13 and 32 name.

* item level: 3 models x 48 configs x 300 items (the envelope's config count; a third of the
  configs greedy 0/1 item scores, the rest 5-seed means k/5), at default settings (the
  resampling count chosen for alpha): every config-level metric plus the noise references,
  the per-config tests with step-down max-T, power and the item bootstrap. Target < 10 s.
* config level: 20 models x 360 configs x 4 benchmarks. Target < 5 s.
* memory (config level, the CLI's peak resident memory): 2 models x 6,000 configs (target
  < 600 MB) and 5 models x 10,000 configs (target < 1 GB).

Each case is timed twice per round: in process (`certify` + its text rendering, what the CLI
does after its imports) and as the real CLI in a subprocess (interpreter start and imports
included). The tables are written once to a temporary folder (CSV, as an external user would
hand them over). Reported: the median over rounds and every round. The machine is shared, so
the load average is recorded before and after. Writes benchmarks/results/certify.json.
Run: .venv/bin/python benchmarks/bench_certify.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def item_table(path: Path, models: int, configs: int, items: int, seed: int) -> None:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    ability = rng.normal(0, 0.3, models)
    difficulty = rng.normal(0, 1.5, items)
    cfg_effect = rng.normal(0, 0.3, (models, configs))
    rows = []
    for m in range(models):
        for c in range(configs):
            seeds = 1 if c % 3 == 0 else 5
            p = 1 / (1 + np.exp(-(ability[m] + cfg_effect[m, c] - difficulty)))
            k = rng.binomial(seeds, p)
            rows.append(pd.DataFrame({"model": f"m{m}", "benchmark": "bbq", "config": f"c{c:03d}",
                                      "item": [f"i{i:04d}" for i in range(items)], "score": k / seeds}))
    pd.concat(rows).to_csv(path, index=False, float_format="%.17g")


def config_table(path: Path, models: int, configs: int, benchmarks: int, seed: int) -> None:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    n = models * configs * benchmarks
    df = pd.DataFrame({
        "model": np.repeat([f"m{m:02d}" for m in range(models)], configs * benchmarks),
        "benchmark": np.tile(np.repeat([f"b{b}" for b in range(benchmarks)], configs), models),
        "config": np.tile([f"c{c:03d}" for c in range(configs)], models * benchmarks),
        "score": np.round(rng.uniform(0.3, 0.7, n) * 300) / 300})
    df.to_csv(path, index=False, float_format="%.17g")


def in_process(path: Path, samples: int | None) -> float:
    from safetyrepro.certify import certify, to_text

    t0 = time.perf_counter()
    res = certify(path, samples=samples)
    to_text(res)
    return time.perf_counter() - t0


def _cli(path: Path, samples: int | None) -> list[str]:
    extra = [] if samples is None else ["--samples", str(samples)]
    return [sys.executable, "-m", "safetyrepro", "certify", str(path), *extra]


def via_cli(path: Path, samples: int | None) -> float:
    t0 = time.perf_counter()
    subprocess.run(_cli(path, samples), check=True, capture_output=True, text=True)
    return time.perf_counter() - t0


def peak_mb(path: Path) -> float:
    """Peak resident memory (MB) of the certify CLI on ``path``, measured in a wrapper process."""
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code, *_cli(path, None)], check=True, capture_output=True, text=True)
    return int(out.stdout.strip()) / 1024


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=None, help="resampling draws (default: certify's own choice)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from safetyrepro.perf.report import publish

    load_start = [round(x, 2) for x in os.getloadavg()]
    cases = {"item level: 3 models x 48 configs x 300 items, samples=%s" % (args.samples or "default"): ("item", 10.0),
             "config level: 20 models x 360 configs x 4 benchmarks": ("config", 5.0)}
    record, rows = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"item": Path(tmp) / "items.csv", "config": Path(tmp) / "cells.csv"}
        item_table(paths["item"], 3, 48, 300, 1)
        config_table(paths["config"], 20, 360, 4, 2)
        for name, (kind, target) in cases.items():
            ip, cli = [], []
            for _ in range(args.rounds):
                ip.append(in_process(paths[kind], args.samples))
                cli.append(via_cli(paths[kind], args.samples))
            med_ip, med_cli = statistics.median(ip), statistics.median(cli)
            record[kind] = {"case": name, "target_s": target, "in_process_s": ip, "cli_s": cli,
                            "median_in_process_s": med_ip, "median_cli_s": med_cli,
                            "rows": sum(1 for _ in open(paths[kind])) - 1,
                            "meets_target": med_cli < target}
            rows.append([name, f"{med_ip:.2f}", f"{med_cli:.2f}", f"< {target:g}",
                         "yes" if med_cli < target else "NO"])
        for models, configs, target in ((2, 6000, 600.0), (5, 10000, 1024.0)):
            path = Path(tmp) / f"mem_{models}x{configs}.csv"
            config_table(path, models, configs, 1, 3)
            mb = peak_mb(path)
            name = f"memory, config level: {models} models x {configs} configs (peak MB)"
            record[f"memory_{models}x{configs}"] = {"case": name, "peak_mb": mb, "target_mb": target,
                                                   "meets_target": mb < target}
            rows.append([name, "-", f"{mb:.0f} MB", f"< {target:g} MB", "yes" if mb < target else "NO"])
    load_end = [round(x, 2) for x in os.getloadavg()]
    publish("certify", ["case", "in process (s)", "CLI incl. start-up (s)", "target", "met"], rows,
            {"rounds": args.rounds, "samples": args.samples, "cases": record,
             "loadavg_start": load_start, "loadavg_end": load_end},
            out_dir=args.out, note=f"load average at start {load_start}, at end {load_end}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
