"""Performance benchmarks' shared code: realistic workloads built from the real
items and task templates (:mod:`.workload`), side-by-side alternating timing
(:mod:`.timing`), process memory and machine description (:mod:`.machine`).

The runnable scripts live in ``benchmarks/`` (see ``benchmarks/README.md``); nothing here is
used by a pipeline run."""
