"""Realistic benchmark workloads: a benchmark's items drawn exactly as a run draws them
(stratified subset + few-shot pool, :func:`safetyrepro.items.build.build_items`) but with any
item count, rendered into the prompts and candidates a cell would use (:mod:`safetyrepro.requests`, as
:mod:`safetyrepro.cells` builds them)."""

from __future__ import annotations

import copy
import importlib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ..cells import ModelCellRunner, group_streams
from ..config import RunConfig, config_from_dict, load_config
from ..grid import Config, config_of
from ..inference import generate_streams
from ..inference.batching import BatchRecord
from ..inference.store import PrefillStore
from ..items import build_items, read_items
from ..plan import Plan
from ..requests import cell_requests
from ..tasks import load_task
from .report import publish
from .timing import alternate


@dataclass
class Workload:
    benchmark: str
    items: list[dict]
    fewshot: list[dict]  # the ordered few-shot pool (k-shot uses the first k)
    subset_hash: str


def load_workload(cfg: RunConfig, benchmark: str, n_items: int) -> Workload:
    """``n_items`` items of ``benchmark`` and its few-shot pool, selected by the run's own
    rules (data source and items seed of ``cfg``; only the item count differs). Built into a
    temporary folder, so the run's results are untouched."""
    raw = copy.deepcopy(cfg.raw)
    raw.setdefault("benchmarks", {}).setdefault(benchmark, {})
    raw["benchmarks"][benchmark] = {**raw["benchmarks"][benchmark], "n_items": int(n_items)}
    sized = config_from_dict(raw, cfg.path)
    with tempfile.TemporaryDirectory(prefix="safetyrepro-perf-") as tmp:
        summary = build_items(sized, benchmark, out_dir=Path(tmp))
        items, _ = read_items(summary["items_path"])
        pool, _ = read_items(summary["fewshot_path"])
    return Workload(benchmark, items.to_dict(orient="records"), pool.to_dict(orient="records"),
                    summary["subset_hash"])


def freeform_prompts(cfg: RunConfig, lm, wl: Workload, config_id: str) -> list[str]:
    """The free-form prompts of cell ``config_id`` for every item (as a cell builds them)."""
    return cell_requests(cfg, lm.tokenizer, load_task(wl.benchmark), config_of(cfg.rules, config_id),
                         wl.items, wl.fewshot).prompts


def logprob_requests(cfg: RunConfig, lm, wl: Workload, config_id: str
                     ) -> tuple[list[str], list[list[str]]]:
    """``(contexts, candidates)`` of logprob cell ``config_id``: the rendered chat context
    and the candidate continuations of every item."""
    req = cell_requests(cfg, lm.tokenizer, load_task(wl.benchmark), config_of(cfg.rules, config_id),
                        wl.items, wl.fewshot)
    return req.contexts, req.candidates


@dataclass
class GroupCase:
    """One decode group of a run's cells as the worker computes it (benchmarks 7 and 8):
    the prompts of (benchmark, template, shots) over the run's items, the group's decodings
    ``[(decoding, n_seeds), ...]``, their streams and the generation settings."""
    prompts: list[str]
    group: list[tuple[str, int]]
    streams: list
    levels: dict[str, dict]
    kw: dict


def group_case(cfg: RunConfig, lm, benchmark: str, template: str, shots: str) -> GroupCase:
    """The decode group of the run's ``(benchmark, template, shots)`` on the loaded ``lm``,
    from the run's own item subset and few-shot pool (``results/items``; run the ``items``
    step of the workflow first)."""
    plan = Plan(cfg)
    if not plan.layout.items_path(benchmark).exists():
        raise FileNotFoundError(f"{plan.layout.items_path(benchmark)} is missing: run `safetyrepro items` "
                                f"(or the workflow) first")
    files = ModelCellRunner()
    items, _ = files.items(plan.layout.items_path(benchmark))
    pool, _ = files.items(plan.layout.fewshot_path(benchmark))
    config = Config(template, "greedy", shots, "freeform")
    req = cell_requests(cfg, lm.tokenizer, load_task(benchmark), config, items, pool)
    group = plan.decode_group(benchmark, config.id)
    levels = {d: cfg.rules.level("decoding", d) for d, _ in group}
    streams, _ = group_streams(group, levels)
    kw = dict(max_new_tokens=req.max_new_tokens, batch_size=req.batch_size)
    return GroupCase(req.prompts, group, streams, levels, kw)


def cell_bench_setup(config_path: str, benchmark: str, threads: int = 0) -> tuple[RunConfig, Plan, list[float]]:
    """What a benchmark that times whole cells through ``run_cell`` needs first: torch's
    threads set (0: torch's default), the load average before any work, the run config and its
    Plan. Raises FileNotFoundError, saying which command builds them, where the run's items
    for ``benchmark`` are missing."""
    if threads:
        torch.set_num_threads(threads)
    load_start = [round(x, 2) for x in os.getloadavg()]
    cfg = load_config(config_path)
    plan = Plan(cfg)
    items = plan.layout.items_path(benchmark)
    if not items.exists():
        raise FileNotFoundError(f"{items} is missing: run `safetyrepro items --config {config_path}` "
                                "(or the workflow) first")
    return cfg, plan, load_start


def group_cases(config_path: str, cases: list[str]):
    """For each ``"MODEL:BENCHMARK:TEMPLATE:SHOTS"`` in ``cases``: ``(case fields, lm,
    GroupCase)``, the model loaded as the worker loads it, one model in memory at a time
    (consecutive cases of one model share it)."""
    cfg = load_config(config_path)
    models: dict = {}
    for case in cases:
        model, bench, template, shots = case.split(":")
        if model not in models:
            models.clear()
            models[model] = ModelCellRunner.load(config_path, model).lm
        lm = models[model]
        yield (model, bench, template, shots), lm, group_case(cfg, lm, bench, template, shots)


def group_comparison(fields: tuple[str, str, str, str], lm, gc: GroupCase, timed, base: str,
                     new: str) -> tuple[list, dict]:
    """Table row and record of two variants of one decode group timed by
    :func:`.timing.alternate` (each result: one list of Generations per stream): medians, the
    ratio ``base / new`` and how many sequences are token-identical."""
    model, bench, template, shots = fields
    a, b = timed.results[base], timed.results[new]
    same = sum(x.token_ids == y.token_ids for sa, sb in zip(a, b) for x, y in zip(sa, sb))
    total = sum(len(s) for s in a)
    ratio = timed.ratio(base, new)
    row = [model, bench, f"{template}-{shots}", timed.median(base), timed.median(new),
           f"{ratio:.2f}x", f"{same}/{total}"]
    record = {"model": model, "benchmark": bench, "template": template, "shots": shots,
              "group": [list(g) for g in gc.group], "times_s": timed.times, "ratio": ratio,
              "identical_sequences": same, "n_sequences": total,
              "model_info": {k: lm.info.get(k) for k in ("quantization", "nf4_matmul", "attention", "linear", "threads")}}
    return row, record


def switch_comparison(config_path: str, cases: list[str], rounds: int, module: str, attr: str,
                      variants: dict[str, object]) -> tuple[list[list], list[dict]]:
    """Benchmarks 8 and 20: each decode group of ``cases`` (``"MODEL:BENCHMARK:TEMPLATE:SHOTS"``)
    with the engine switch ``module.attr`` set to each of the two ``variants`` (name -> value,
    the baseline first), timed ALTERNATELY on one loaded model; the switch is restored after
    every run. Returns the rows and records of :func:`group_comparison`; each record also holds
    the shipped value (``attr`` in lower case) and the last run's decode statistics per variant
    (``decode``)."""
    mod = importlib.import_module(module)
    shipped = getattr(mod, attr)
    (base, _), (new, _) = variants.items()
    rows, records = [], []
    for fields, lm, gc in group_cases(config_path, cases):
        decode: dict[str, list] = {}

        def runner(name, value):
            def run():
                setattr(mod, attr, value)
                record = BatchRecord()
                try:
                    return generate_streams(lm, gc.prompts, gc.streams, store=PrefillStore(),
                                            record=record, **gc.kw)
                finally:
                    setattr(mod, attr, shipped)
                    decode[name] = record.decode
            return run

        timed = alternate({name: runner(name, value) for name, value in variants.items()}, rounds)
        row, record = group_comparison(fields, lm, gc, timed, base, new)
        rows.append(row)
        records.append(record | {attr.lower(): shipped, "decode": dict(decode)})
    return rows, records


def decode_switch_benchmark(args, name: str, attr: str, variants: dict[str, object],
                            headers: list[str], share: tuple[str, str, str],
                            module: str = "safetyrepro.inference.decode") -> int:
    """Benchmarks 20, 21 and 23: :func:`switch_comparison` of the engine switch
    ``<module>.<attr>`` over ``args.cases`` (``args``: a
    :func:`.args.decode_group_parser` namespace), plus one share from the shipped variant's
    decode records, ``share = (numerator, denominator, record key)`` (e.g. dummy slots over
    token slots), as the table's last column; published as ``<name>.json``. Returns the exit
    status (2 where the run's items are missing)."""
    try:
        rows, records = switch_comparison(args.config, args.cases, args.rounds, module, attr,
                                          variants)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    shipped = list(variants)[1]
    numerator, denominator, key = share
    for row, record in zip(rows, records):
        decode = record["decode"][shipped]
        total = sum(d[denominator] for d in decode)
        record[key] = sum(d[numerator] for d in decode) / total if total else 0.0
        row.append(record[key])
    publish(name, headers, rows, {"records": records}, out_dir=args.out)
    return 0
