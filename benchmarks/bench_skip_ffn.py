"""Benchmark 20: decode steps whose dummy columns skip the feed-forward blocks.

Its record (``results/skip_ffn.json``, ``c3ddb27``) measured the stream-column layout before
``e70fb55``, where a prompt's finished streams kept a masked dummy column in every decode step
until the whole row left the batch; since then a step feeds one column per distinct history
and the dummies are the padding of rows narrower than the step's widest (and, in a
continuous batch, finished streams' columns; ``safetyrepro.inference.decode``). No logit is read
there and no other position attends to it, so the decode loops have
``safetyrepro.inference.prefill.forward`` run each layer's feed-forward block on the running
streams' positions only (``safetyrepro.inference.decode.SKIP_UNREAD_FFN``). This times decode
groups (greedy + T=0.3 x 5 seeds + T=0.7 x 5 seeds, ``generate_streams``, as the worker runs
them) of the run's items on the model as the worker loads it, in two variants timed
ALTERNATELY in one process:

* every position: ``SKIP_UNREAD_FFN = False`` (the code before);
* running only:   ``SKIP_UNREAD_FFN = True`` (the shipped code).

Reports the seconds of each, the ratio, how many of the 11 x items sequences are
token-identical and the share of decode positions that were dummies. Writes
benchmarks/results/skip_ffn.json. Run: benchmarks/README.md.
"""

from __future__ import annotations

import sys

from safetyrepro.perf.args import SLICE_DECODE_GROUPS, decode_group_parser


def main(argv=None) -> int:
    args = decode_group_parser(__doc__, SLICE_DECODE_GROUPS).parse_args(argv)
    from safetyrepro.perf.workload import decode_switch_benchmark  # torch: not for --help
    return decode_switch_benchmark(
        args, "skip_ffn", "SKIP_UNREAD_FFN", {"every position": False, "running only": True},
        ["model", "benchmark", "template-shots", "every position s (median)",
         "running only s (median)", "speed-up", "identical sequences",
         "dummy share of decode positions"],
        ("dummy_slots", "token_slots", "dummy_share"))


if __name__ == "__main__":
    sys.exit(main())
