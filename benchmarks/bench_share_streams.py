"""Benchmark 21: streams with equal tokens so far decoding as one column.

A decode group's greedy stream and its low-temperature samples often produce the same tokens
for a while (the default run's shards: about half of all decode positions repeat another
stream's history). ``safetyrepro.inference.decode.decode_stream_columns`` feeds one column per
distinct history and lets each stream sample the shared logits with its own generator
(``SHARE_EQUAL_STREAMS``). This times decode groups (greedy + T=0.3 x 5 seeds + T=0.7 x 5
seeds, ``generate_streams``, as the worker runs them) of the run's items on the model as the
worker loads it, in two variants timed ALTERNATELY in one process:

* own column: ``SHARE_EQUAL_STREAMS = False`` (one column per running stream);
* shared:     ``SHARE_EQUAL_STREAMS = True`` (the shipped code).

Reports the seconds of each, the ratio, how many of the 11 x items sequences are
token-identical and the share of decode tokens that took another stream's column. Writes
benchmarks/results/share_streams.json. Run: benchmarks/README.md.
"""

from __future__ import annotations

import sys

from safetyrepro.perf.args import SLICE_DECODE_GROUPS, decode_group_parser


def main(argv=None) -> int:
    args = decode_group_parser(__doc__, SLICE_DECODE_GROUPS).parse_args(argv)
    from safetyrepro.perf.workload import decode_switch_benchmark  # torch: not for --help
    return decode_switch_benchmark(
        args, "share_streams", "SHARE_EQUAL_STREAMS", {"own column": False, "shared": True},
        ["model", "benchmark", "template-shots", "own column s (median)", "shared s (median)",
         "speed-up", "identical sequences", "shared share of decode tokens"],
        ("shared_tokens", "tokens", "shared_share"))


if __name__ == "__main__":
    sys.exit(main())
