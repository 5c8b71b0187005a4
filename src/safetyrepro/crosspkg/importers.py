"""`safetyrepro import`: other harnesses' per-item results -> certify's item-level long table.

Output columns: ``model, benchmark, config, item, score`` and one column per harness setting
that differs between the imported runs (the *axis columns*; ``config`` is their values joined
by '-' in column order, the convention of ``certify --config-cols``). Settings that are equal in
every run are not axes; they are returned in ``ImportResult.constant``.

* lm-evaluation-harness: a folder written with ``--output_path DIR --log_samples`` (searched
  recursively) holds ``results_<time>.json`` and one ``samples_<task>_<time>.jsonl`` per task.
  A results file is one run; its settings are the task (variant), ``num_fewshot``, chat template
  on/off, few-shot as multi-turn, the system instruction, the generation kwargs, the model
  arguments other than the path, and the lm-eval version.
* Inspect: eval logs read through :func:`inspect_ai.log.read_eval_log` (any format Inspect
  writes). Settings: the task, its arguments, the solver plan, the generate config, the model
  arguments other than the path, and the inspect_ai version. The item score is the scorer's
  value (``C``/``I`` and other Inspect letter values map through ``value_to_float``), averaged
  over epochs.

Errors (:class:`~safetyrepro.errors.DataError`, naming the file): a run without per-sample
results, a metric the samples do not carry (the available ones are listed), runs of one
benchmark whose item sets differ (the items each lacks are listed), two runs with identical
settings for the same model and benchmark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..errors import DataError

#: name part of an lm-eval task -> the benchmark it measures (longest match wins; e.g.
#: truthfulqa_mc1, sr_truthfulqa_mc1 -> truthfulqa); other tasks keep their own name as benchmark.
LMEVAL_BENCHMARKS = {
    "truthfulqa": "truthfulqa", "bbq": "bbq", "crows_pairs": "crows_pairs",
    "toxigen": "toxigen", "xstest": "xstest",
}


@dataclass
class Run:
    """One imported run: a (model, benchmark) with its settings and per-item scores."""

    source: str
    model: str
    benchmark: str
    settings: dict
    scores: dict           # item id -> score
    metric: str


@dataclass
class ImportResult:
    table: pd.DataFrame
    axes: list[str]
    constant: dict = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)


def benchmark_of(task: str, override: str | None = None) -> str:
    if override:
        return override
    hits = [p for p in LMEVAL_BENCHMARKS if p in task]
    return LMEVAL_BENCHMARKS[max(hits, key=len)] if hits else task


def _model_name(model_args, fallback: str) -> tuple[str, dict]:
    """(name, other args) from lm-eval's model_args (string 'k=v,...' or dict)."""
    if isinstance(model_args, str):
        args = dict(kv.split("=", 1) for kv in model_args.split(",") if "=" in kv)
    else:
        args = dict(model_args or {})
    path = args.pop("pretrained", None) or args.pop("model", None) or args.pop("model_path", None)
    return str(path or fallback), {k: str(v) for k, v in sorted(args.items()) if k not in ("device",)}


def short_names(paths) -> dict[str, str]:
    """Model path -> the shortest trailing part of the path that tells the distinct paths apart,
    after dropping trailing generic folder names such as 'hf' (a prepared model's folder)."""
    paths = sorted(set(paths))
    parts = {}
    for p in paths:
        v = [c for c in p.rstrip("/").split("/") if c] or [p]
        while len(v) > 1 and v[-1] in _GENERIC:
            v = v[:-1]
        parts[p] = v
    for k in range(1, max(len(v) for v in parts.values()) + 1):
        names = {p: "/".join(v[-k:]) for p, v in parts.items()}
        if len(set(names.values())) == len(paths):
            return names
    return {p: p for p in paths}


_GENERIC = {"hf", "model", "models", "snapshots", "main", "checkpoint", "final"}


def _fmt(v) -> str:
    """A setting's value as text; empty values read 'none' (a config id is never empty)."""
    if v is None or v == "" or v == {} or v == []:
        return "none"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, default=str)
    return str(v)


# ---------------------------------------------------------------------------------- lm-eval


def _lmeval_results_files(paths) -> list[Path]:
    out = []
    for p in map(Path, paths):
        if not p.exists():
            raise DataError(p, "not found")
        if p.is_file():
            out.append(p)
            continue
        found = sorted(p.rglob("results_*.json"))
        if not found:
            raise DataError(p, "no lm-eval results_*.json under this folder (written by lm_eval --output_path)")
        out += found
    return out


def _samples_file(results: Path, task: str) -> Path | None:
    stamp = results.stem[len("results_"):]
    exact = results.parent / f"samples_{task}_{stamp}.jsonl"
    if exact.exists():
        return exact
    cands = sorted(results.parent.glob(f"samples_{task}_*.jsonl"))
    return cands[-1] if len(cands) == 1 else None


def _lmeval_item_id(rec: dict) -> str:
    doc = rec.get("doc") or {}
    for key in ("item_id", "id", "example_id"):
        if isinstance(doc, dict) and key in doc and doc[key] is not None:
            return str(doc[key])
    return str(rec["doc_id"])


def read_lmeval_run(results: Path, metric: str | None = None, benchmark: str | None = None) -> list[Run]:
    """The runs (one per task) of one lm-eval results file and its samples files."""
    try:
        res = json.loads(results.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(results, f"cannot read as JSON: {exc}") from exc
    if "results" not in res or "config" not in res:
        raise DataError(results, "not an lm-eval results file (no 'results'/'config' fields)")
    cfg = res["config"]
    model, margs = _model_name(cfg.get("model_args"), str(res.get("model_name") or cfg.get("model") or "model"))
    version = res.get("lm_eval_version") or _installed("lm_eval") or "unknown"
    runs = []
    tasks = sorted(res.get("configs") or res["results"])   # configs: tasks only, no groups
    for task in tasks:
        tcfg = (res.get("configs") or {}).get(task, {})
        sfile = _samples_file(results, task)
        if sfile is None:
            raise DataError(results, f"task {task!r}: no per-sample results (samples_{task}_*.jsonl) next to it; "
                                     "run lm_eval with --log_samples")
        recs = []
        with open(sfile) as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        recs.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise DataError(sfile, f"line {n} is not JSON: {exc}") from exc
        if not recs:
            raise DataError(sfile, "no samples")
        names = recs[0].get("metrics") or sorted(
            k for k, v in recs[0].items() if isinstance(v, (int, float)) and k not in ("doc_id",))
        m = metric or ("acc" if "acc" in names else (names[0] if len(names) == 1 else None))
        if m is None:
            raise DataError(sfile, f"several metrics {names}; choose one with --metric")
        scores = {}
        for n, r in enumerate(recs, 1):
            if m not in r:
                raise DataError(sfile, f"unknown metric {m!r} (line {n}); the samples carry {names}")
            v = r[m]
            if isinstance(v, (list, tuple)):
                raise DataError(sfile, f"metric {m!r} is not a per-item number (line {n}: {v!r}); "
                                       f"choose a per-item metric of {names}")
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise DataError(sfile, f"metric {m!r} is not numeric on line {n}: {v!r}") from None
            iid = _lmeval_item_id(r)
            if iid in scores:
                raise DataError(sfile, f"item {iid!r} appears twice")
            scores[iid] = v
        settings = {
            "package": f"lm-eval {version}",
            "task": task,
            "num_fewshot": (res.get("n-shot") or {}).get(task, tcfg.get("num_fewshot")),
            "chat_template": "on" if (cfg.get("apply_chat_template") or res.get("chat_template")) else "off",
            "fewshot_as_multiturn": bool(res.get("fewshot_as_multiturn", cfg.get("fewshot_as_multiturn", False))),
            "system_instruction": res.get("system_instruction") or "",
            "gen_kwargs": _fmt(tcfg.get("generation_kwargs") or cfg.get("gen_kwargs") or ""),
            "model_args": _fmt(margs),
            "metric": m,
        }
        runs.append(Run(str(results), model, benchmark_of(task, benchmark), settings, scores, m))
    return runs


def _installed(pkg: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------- Inspect


def _score_value(v, path, sid) -> float:
    from inspect_ai.scorer import value_to_float

    if isinstance(v, (dict, list)):
        raise DataError(path, f"sample {sid!r}: score value {v!r} is not a single number or letter grade")
    try:
        return float(value_to_float()(v))
    except Exception as exc:  # noqa: BLE001 - inspect's converter raises plain exceptions
        raise DataError(path, f"sample {sid!r}: cannot turn score value {v!r} into a number: {exc}") from None


def read_inspect_log(path: Path, metric: str | None = None, benchmark: str | None = None) -> Run:
    """One Inspect eval log -> a run (item score = the scorer's value, mean over epochs)."""
    from inspect_ai.log import read_eval_log

    path = Path(path)
    if not path.exists():
        raise DataError(path, "not found")
    try:
        log = read_eval_log(str(path))
    except Exception as exc:  # noqa: BLE001
        raise DataError(path, f"cannot read as an Inspect eval log: {exc}") from exc
    if log.status != "success":
        raise DataError(path, f"the eval did not finish (status {log.status!r})")
    if not log.samples:
        raise DataError(path, "no per-sample results in this log (written with --no-log-samples or "
                              "log_samples=False?)")
    ev = log.eval
    available = sorted({k for s in log.samples for k in (s.scores or {})})
    m = metric or (available[0] if len(available) == 1 else None)
    if m is None:
        raise DataError(path, f"several scorers {available}; choose one with --metric")
    per_item: dict[str, list[float]] = {}
    for s in log.samples:
        if not s.scores or m not in s.scores:
            raise DataError(path, f"unknown metric {m!r} for sample {s.id!r}; the samples carry {available}")
        per_item.setdefault(str(s.id), []).append(_score_value(s.scores[m].value, path, s.id))
    scores = {k: sum(v) / len(v) for k, v in per_item.items()}
    margs = {k: v for k, v in sorted((ev.model_args or {}).items()) if k not in ("model_path", "tokenizer_path", "device")}
    model = str((ev.model_args or {}).get("model_path") or ev.model)
    plan = log.plan
    steps = "; ".join(f"{st.solver}({_fmt(st.params) if st.params else ''})" for st in (plan.steps if plan else []))
    gen = ev.model_generate_config.model_dump(exclude_none=True) if ev.model_generate_config else {}
    if plan and plan.config:
        gen.update(plan.config.model_dump(exclude_none=True))
    version = (ev.packages or {}).get("inspect_ai") or _installed("inspect_ai") or "unknown"
    task = ev.task.split("/")[-1]
    settings = {
        "package": f"inspect_ai {version}",
        "task": task,
        "task_args": _fmt(ev.task_args or {}),
        "solver": steps,
        "generate_config": _fmt(gen),
        "model_args": _fmt(margs),
        "epochs": ev.config.epochs if ev.config and ev.config.epochs else 1,
        "metric": m,
    }
    return Run(str(path), model, benchmark_of(task, benchmark), settings, scores, m)


# ---------------------------------------------------------------------------------- assemble

#: short column names for the settings (the axis columns)
_SHORT = {"num_fewshot": "shots", "chat_template": "chat", "fewshot_as_multiturn": "multiturn",
          "system_instruction": "system", "generate_config": "generate"}


def assemble(runs: list[Run], where: str) -> ImportResult:
    """Runs -> the long table; axis columns are the settings that differ between runs."""
    if not runs:
        raise DataError(where, "nothing to import")
    names = short_names(r.model for r in runs)
    for r in runs:
        r.model = names[r.model]
    keys = []
    for r in runs:
        keys += [k for k in r.settings if k not in keys]
    vals = {k: {_fmt(r.settings.get(k, "")) for r in runs} for k in keys}
    axes = [k for k in keys if len(vals[k]) > 1]
    constant = {k: next(iter(vals[k])) for k in keys if len(vals[k]) == 1}
    seen = {}
    for r in runs:
        key = (r.model, r.benchmark, tuple(_fmt(r.settings.get(a, "")) for a in axes))
        if key in seen:
            raise DataError(r.source, f"same model {r.model!r}, benchmark {r.benchmark!r} and settings as "
                                      f"{seen[key]}: two runs of one config cannot be told apart")
        seen[key] = r.source
    # every run of a benchmark must score the same items
    for b in sorted({r.benchmark for r in runs}):
        rs = [r for r in runs if r.benchmark == b]
        union = set().union(*(r.scores for r in rs))
        bad = [(r, sorted(union - set(r.scores))) for r in rs if set(r.scores) != union]
        if bad:
            lines = [f"  {r.source} ({r.model}, {r.settings.get('task')}): lacks {len(miss)} item(s) "
                     f"{miss[:10]}{' ...' if len(miss) > 10 else ''}" for r, miss in bad]
            raise DataError(where, f"benchmark {b!r}: the runs score different item sets "
                                   f"({len(union)} items in all):\n" + "\n".join(lines))
    cols = [_SHORT.get(a, a) for a in axes]
    rows = []
    for r in runs:
        ax = {c: _fmt(r.settings.get(a, "")) for a, c in zip(axes, cols)}
        cfg = "-".join(ax.values()) if ax else r.settings.get("package", "run")
        for item, s in sorted(r.scores.items()):
            rows.append({"model": r.model, "benchmark": r.benchmark, "config": cfg, "item": item,
                         "score": s, **ax})
    table = pd.DataFrame(rows)
    return ImportResult(table, cols, constant, runs)


def import_lmeval(paths, metric: str | None = None, benchmark: str | None = None) -> ImportResult:
    runs = []
    for f in _lmeval_results_files(paths):
        runs += read_lmeval_run(f, metric, benchmark)
    return assemble(runs, ", ".join(map(str, paths)))


def import_inspect(logs, metric: str | None = None, benchmark: str | None = None) -> ImportResult:
    files = []
    for p in map(Path, logs):
        if p.is_dir():
            found = sorted([*p.glob("*.eval"), *p.glob("*.json")])
            if not found:
                raise DataError(p, "no Inspect logs (*.eval, *.json) in this folder")
            files += found
        else:
            files.append(p)
    return assemble([read_inspect_log(f, metric, benchmark) for f in files], ", ".join(map(str, logs)))
