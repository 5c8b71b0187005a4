"""Benchmark 23: decode groups past a sliding window, with the window masked by position.

Gemma-3's sliding layers count their 512-token window in cache columns when they build their
own masks, so a batch padded between a shared prefix and a shorter row's tokens computed other
numbers than the row alone (fixed with this benchmark; RESULTS.md section 20). Past the window
the engine now masks the sliding layers itself, by position
(``safetyrepro.inference.capabilities.WINDOW_MASKS``): packed prefill over one shared prefix,
stream columns and shared equal histories, as inside the window. Without those masks (a model
that takes no mask per layer kind) the call shares no prefix and decodes repeated rows. This
times the default run's Gemma-3 decode groups past the window (greedy + T=0.3 x 5 seeds +
T=0.7 x 5 seeds, ``generate_streams`` as the worker runs them, on the model as the worker
loads it) in two variants timed ALTERNATELY in one process:

* no masks: ``WINDOW_MASKS = False`` (left-padded rows, no shared prefix, repeated rows);
* masks:    ``WINDOW_MASKS = True`` (the shipped code).

Both are exact (fp32 outputs agree with each prompt alone: tests/inference/
test_packed_engine.py). Reports the seconds of each, the ratio, how many of the 11 x items
sequences are token-identical and the share of decode tokens that took another stream's
column. Writes benchmarks/results/window_masks.json. Run: benchmarks/README.md.
"""

from __future__ import annotations

import sys

from safetyrepro.perf.args import decode_group_parser

# the default run's Gemma-3 groups whose prompts pass the 512-token window
PAST_WINDOW_GROUPS = [f"gemma3-270m:{case}" for case in (
    "bbq:T2:k5", "bbq:T3:k5", "bbq:T4:k5", "truthfulqa:T1:k5", "truthfulqa:T2:k5",
    "truthfulqa:T3:k5", "truthfulqa:T4:k3", "truthfulqa:T4:k5")]


def main(argv=None) -> int:
    args = decode_group_parser(__doc__, PAST_WINDOW_GROUPS).parse_args(argv)
    from safetyrepro.perf.workload import decode_switch_benchmark  # torch: not for --help
    return decode_switch_benchmark(
        args, "window_masks", "WINDOW_MASKS", {"no masks": False, "masks": True},
        ["model", "benchmark", "template-shots", "no masks s (median)", "masks s (median)",
         "speed-up", "identical sequences", "shared share of decode tokens"],
        ("shared_tokens", "tokens", "shared_share"),
        module="safetyrepro.inference.capabilities")


if __name__ == "__main__":
    sys.exit(main())
