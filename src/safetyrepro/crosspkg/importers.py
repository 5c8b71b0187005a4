"""`safetyrepro import`: other harnesses' per-item results -> certify's item-level long table.

Columns ``model, benchmark, config, item, score`` plus one *axis column* per harness setting
that differs between the imported runs (``config`` joins their values by '-', as ``certify
--config-cols`` does); settings equal in every run go to ``ImportResult.constant``. Readers:
lm-evaluation-harness ``--log_samples`` folders (:func:`read_lmeval_run`), Inspect eval logs
(:func:`read_inspect_log`), HELM run folders (:func:`read_helm_run`). Bad input raises a
DataError naming file and field: a wrong-typed field, no per-sample results, an unknown metric
(the available ones listed), runs of one benchmark over different items, or two runs with
identical settings for the same model and benchmark.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pandas as pd

from ..errors import DataError

#: name part of an lm-eval task -> the benchmark it measures (longest match wins; e.g.
#: truthfulqa_mc1, sr_truthfulqa_mc1 -> truthfulqa); other tasks keep their own name as benchmark.
LMEVAL_BENCHMARKS = {
    "truthfulqa": "truthfulqa", "bbq": "bbq", "crows_pairs": "crows_pairs",
    "toxigen": "toxigen", "xstest": "xstest", "truthful_qa": "truthfulqa",   # the last: HELM's name
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
    refs: dict = field(default_factory=dict)   # item id -> the source's own id of it (source_id)


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


# ---------------------------------------------------------------------------------- reading
# Third-party files are data: every field is type-checked before use, so a malformed file is a
# one-line DataError naming the file and the field (or line), never a traceback.


def _short(v, n: int = 60) -> str:
    r = repr(v)
    return r if len(r) <= n else r[:n] + "..."


def _read_text(path: Path) -> str:
    if path.is_dir():
        raise DataError(path, "is a folder, expected a file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(path, f"not UTF-8 text (byte {exc.start}); a binary file?") from None


def _parse_json(text: str, path: Path, where: str = ""):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(path, f"{where}not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:   # e.g. an integer over Python's digit limit
        raise DataError(path, f"{where}not readable JSON: {str(exc).splitlines()[0][:80]}") from None


def _obj(v, path: Path, field: str, *, optional: bool = True) -> dict:
    """``v`` as a JSON object (absent/null -> {} when optional)."""
    if v is None and optional:
        return {}
    if not isinstance(v, dict):
        raise DataError(path, f"field {field!r} is {type(v).__name__} {_short(v, 40)}, expected an object")
    return v


def _number(v, path: Path, where: str) -> float:
    """A finite float from a JSON number (or bool); anything else is a DataError."""
    if isinstance(v, (bool, int, float)):
        try:
            f = float(v)
        except OverflowError:
            raise DataError(path, f"{where}: {str(v)[:20]}... is too large for a score") from None
        if math.isfinite(f):
            return f
    raise DataError(path, f"{where}: {_short(v, 40)} is not a finite number")


def _text(v, path: Path, field: str) -> str:
    if v is None or isinstance(v, (str, int, float, bool)):
        return "" if v is None else str(v)
    raise DataError(path, f"field {field!r} is {type(v).__name__} {_short(v, 40)}, expected text")


# ---------------------------------------------------------------------------------- lm-eval


def _lmeval_results_files(paths) -> list[Path]:
    out = []
    for p in map(Path, paths):
        if not p.exists():
            raise DataError(p, "not found")
        if not p.is_dir():
            out.append(p)
            continue
        found = sorted(p.rglob("results_*.json"))
        if not found:
            raise DataError(p, "no lm-eval results_*.json under this folder (written by lm_eval --output_path)")
        out += found
    return out


def _samples_file(results: Path, task: str) -> Path | None:
    """The samples file of ``task`` beside ``results`` (same time stamp, else the only one);
    names compared as text, since a task name from the file may hold glob or path characters."""
    stamp = results.stem[len("results_"):]
    names = {p.name: p for p in results.parent.iterdir()}
    exact = f"samples_{task}_{stamp}.jsonl"
    if exact in names:
        return names[exact]
    cands = sorted(n for n in names if n.startswith(f"samples_{task}_") and n.endswith(".jsonl"))
    return names[cands[-1]] if len(cands) == 1 else None


#: document fields that carry a dataset's own item id (recorded as ``source_id``, never the key:
#: BBQ's ``example_id`` restarts in every category of its "All" set)
DOC_ID_FIELDS = ("item_id", "id", "example_id")


def _doc_ref(rec: dict) -> str | None:
    doc = rec.get("doc")
    if isinstance(doc, dict):
        for key in DOC_ID_FIELDS:
            v = doc.get(key)
            if isinstance(v, (str, int, float)) and not isinstance(v, bool) and str(v) != "":
                return str(v)
    return None


def _read_samples(sfile: Path) -> list[tuple[int, dict]]:
    """(line number, record) of an lm-eval samples JSONL file; every record an object with a
    doc_id (int, or text)."""
    recs = []
    for n, line in enumerate(_read_text(sfile).splitlines(), 1):
        if not line.strip():
            continue
        r = _parse_json(line, sfile, f"line {n}: ")
        if not isinstance(r, dict):
            raise DataError(sfile, f"line {n}: a {type(r).__name__}, expected a sample object")
        d = r.get("doc_id")
        if isinstance(d, bool) or not isinstance(d, (int, str)) or d == "":
            raise DataError(sfile, f"line {n}: field 'doc_id' is {_short(d, 40)}, expected an integer"
                            if "doc_id" in r else f"line {n}: no 'doc_id' field")
        f = r.get("filter", "none")
        if not isinstance(f, str) or not f:
            raise DataError(sfile, f"line {n}: field 'filter' is {_short(f, 40)}, expected a name")
        recs.append((n, r))
    if not recs:
        raise DataError(sfile, "no samples")
    return recs


def _metric_names(rec: dict) -> list[str]:
    names = rec.get("metrics")
    if isinstance(names, list) and names and all(isinstance(m, str) for m in names):
        return names
    return sorted(k for k, v in rec.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                  and k != "doc_id")


def read_lmeval_run(results: Path, metric: str | None = None, benchmark: str | None = None,
                    filter_name: str | None = None) -> list[Run]:
    """The runs of one lm-eval results file and its samples files: one per (task, filter).

    Each filter pipeline is its own run with setting ``filter`` (``filter_name`` keeps only
    that one). The item id is lm-eval's doc_id; the document's own id, if any, goes to
    ``Run.refs``. Settings: the task, ``num_fewshot``, chat template, multi-turn few-shot, the
    system instruction, the generation kwargs, the model arguments other than the path, the
    lm-eval version and the filter."""
    results = Path(results)
    res = _parse_json(_read_text(results), results)
    if not isinstance(res, dict) or "results" not in res or "config" not in res:
        raise DataError(results, "not an lm-eval results file (a JSON object with 'results' and 'config')")
    cfg = _obj(res["config"], results, "config")
    configs = _obj(res.get("configs"), results, "configs")
    nshot = _obj(res.get("n-shot"), results, "n-shot")
    margs = cfg.get("model_args")
    if margs is not None and not isinstance(margs, (str, dict)):
        raise DataError(results, f"field 'config.model_args' is {type(margs).__name__}, expected text or an object")
    model, margs = _model_name(margs, _text(res.get("model_name") or cfg.get("model") or "model", results,
                                            "model_name"))
    version = _text(res.get("lm_eval_version"), results, "lm_eval_version") or _installed("lm_eval") or "unknown"
    tasks = sorted(configs or _obj(res["results"], results, "results"))   # configs: tasks only, no groups
    runs = []
    for task in tasks:
        tcfg = _obj(configs.get(task), results, f"configs.{task}")
        shots = nshot.get(task, tcfg.get("num_fewshot"))
        if shots is not None and (isinstance(shots, bool) or not isinstance(shots, int)):
            raise DataError(results, f"field 'n-shot.{task}' is {_short(shots, 40)}, expected an integer")
        sfile = _samples_file(results, task)
        if sfile is None:
            raise DataError(results, f"task {task!r}: no per-sample results (samples_{task}_*.jsonl) next to it; "
                                     "run lm_eval with --log_samples")
        recs = _read_samples(sfile)
        filters = list(dict.fromkeys(r.get("filter", "none") for _, r in recs))
        if filter_name is not None and len(filters) > 1:   # a task with one pipeline keeps it
            if filter_name not in filters:
                raise DataError(sfile, f"no filter {filter_name!r}; the samples carry filters {filters}")
            filters = [filter_name]
        names = _metric_names(recs[0][1])
        m = metric or ("acc" if "acc" in names else (names[0] if len(names) == 1 else None))
        if m is None:
            raise DataError(sfile, f"several metrics {names}; choose one with --metric")
        gen = tcfg.get("generation_kwargs") or cfg.get("gen_kwargs") or ""
        base = {
            "package": f"lm-eval {version}",
            "task": task,
            "num_fewshot": shots,
            "chat_template": "on" if (cfg.get("apply_chat_template") or res.get("chat_template")) else "off",
            "fewshot_as_multiturn": bool(res.get("fewshot_as_multiturn", cfg.get("fewshot_as_multiturn", False))),
            "system_instruction": _text(res.get("system_instruction"), results, "system_instruction"),
            "gen_kwargs": _fmt(gen),
            "model_args": _fmt(margs),
        }
        for flt in filters:
            scores, refs = {}, {}
            for n, r in recs:
                if r.get("filter", "none") != flt:
                    continue
                if m not in r:
                    raise DataError(sfile, f"unknown metric {m!r} (line {n}); the samples carry {names}")
                v = r[m]
                if isinstance(v, (list, tuple, dict)):
                    raise DataError(sfile, f"metric {m!r} is not a per-item number (line {n}: {_short(v, 40)}); "
                                           f"choose a per-item metric of {names}")
                iid = str(r["doc_id"])
                if iid in scores:
                    raise DataError(sfile, f"line {n}: doc_id {iid} appears twice for filter {flt!r}")
                scores[iid] = _number(v, sfile, f"line {n}, metric {m!r}")
                ref = _doc_ref(r)
                if ref is not None:
                    refs[iid] = ref
            runs.append(Run(str(results), model, benchmark_of(task, benchmark),
                            {**base, "filter": flt, "metric": m}, scores, m, refs))
    return runs


def _installed(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------- Inspect


def _score_value(v, path, sid) -> float:
    from inspect_ai.scorer import value_to_float  # deferred: inspect_ai is optional (harness extra)

    if isinstance(v, (dict, list)):
        raise DataError(path, f"sample {sid!r}: score value {v!r} is not a single number or letter grade")
    try:
        f = value_to_float()(v)
    except Exception as exc:  # noqa: BLE001 - inspect's converter raises plain exceptions
        raise DataError(path, f"sample {sid!r}: cannot turn score value {_short(v, 40)} into a number "
                              f"({_first_line(exc)})") from None
    return _number(f, path, f"sample {sid!r}, score value {_short(v, 40)}")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


def read_inspect_log(src, metric: str | None = None, benchmark: str | None = None) -> Run:
    """One Inspect eval log (a path, or an EvalLogInfo from list_eval_logs) -> a run. Item score:
    the scorer's value (letter values through ``value_to_float``), mean over epochs. Settings:
    the task and its arguments, the solver plan, the generate config, the model arguments
    other than the path and the inspect_ai version."""
    from inspect_ai.log import read_eval_log  # deferred: inspect_ai is optional (harness extra)

    name = getattr(src, "name", None) if not isinstance(src, (str, Path)) else str(src)
    path = Path(name.removeprefix("file://"))
    if isinstance(src, (str, Path)):
        if not path.exists():
            raise DataError(path, "not found")
        if path.is_dir():
            raise DataError(path, "is a folder, expected an Inspect log file")
    try:
        log = read_eval_log(src if not isinstance(src, Path) else str(src))
    except Exception as exc:  # noqa: BLE001 - Inspect raises pydantic, zip, JSON and OS errors
        raise DataError(path, f"cannot read as an Inspect eval log ({_first_line(exc)})") from None
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
    seen = set()
    for s in log.samples:
        if not s.scores or m not in s.scores:
            raise DataError(path, f"unknown metric {m!r} for sample {s.id!r}; the samples carry {available}")
        if (str(s.id), s.epoch) in seen:
            raise DataError(path, f"sample {s.id!r} appears twice in epoch {s.epoch}")
        seen.add((str(s.id), s.epoch))
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


# ---------------------------------------------------------------------------------- HELM
# A HELM run folder (benchmark_output/runs/<suite>/<run name>/, written by helm-run) read as
# JSON: run_spec.json (RunSpec), scenario_state.json (ScenarioState: the evaluated instances),
# per_instance_stats.json (a list of PerInstanceStats). crfm-helm is not needed to read them
# (its pins conflict with this environment's torch and datasets; docs/CROSS_PACKAGE.md).

#: PerturbationDescription fields that describe how a stat is computed, not which perturbation
_PERT_META = {"name", "robustness", "fairness", "computed_on"}


def _helm_json(run: Path, name: str, kind: type):
    f = run / name
    if not f.exists():
        raise DataError(run, f"no {name} (not a HELM run folder written by helm-run?)")
    v = _parse_json(_read_text(f), f)
    if not isinstance(v, kind):
        raise DataError(f, f"a {type(v).__name__}, expected a JSON {'object' if kind is dict else 'list'}")
    return f, v


def _helm_item(iid, pert, f: Path, where: str) -> str:
    """Item id: the instance id, plus the perturbation (name and parameters) if there is one."""
    if not isinstance(iid, str) or not iid:
        raise DataError(f, f"{where}: instance id {_short(iid, 40)} is not text")
    if pert is None:
        return iid
    pert = _obj(pert, f, f"{where}.perturbation")
    name = pert.get("name")
    if not isinstance(name, str) or not name:
        raise DataError(f, f"{where}: perturbation without a name")
    params = ",".join(f"{k}={_fmt(v)}" for k, v in sorted(pert.items()) if k not in _PERT_META)
    return f"{iid}~{name}" + (f"({params})" if params else "")


def helm_run_dirs(paths) -> list[Path]:
    """Run folders (those holding run_spec.json): the paths themselves or, for a suite or
    benchmark_output folder, every run folder under it."""
    out = []
    for p in map(Path, paths):
        if not p.exists():
            raise DataError(p, "not found")
        if not p.is_dir():
            raise DataError(p, "expected a HELM run folder (benchmark_output/runs/<suite>/<run>)")
        if (p / "run_spec.json").exists():
            out.append(p)
            continue
        found = sorted(f.parent for f in p.rglob("run_spec.json") if not f.is_dir())
        if not found:
            raise DataError(p, "no HELM run folders (run_spec.json) under this folder")
        out += found
    return out


def read_helm_run(run: Path, metric: str | None = None, benchmark: str | None = None) -> Run:
    """One HELM run folder -> a run. Item = instance id (+ perturbation); score = the mean of
    the per-instance stat ``metric`` (default exact_match), averaged over train trials."""
    run = Path(run)
    sf, spec = _helm_json(run, "run_spec.json", dict)
    adapter = _obj(spec.get("adapter_spec"), sf, "adapter_spec", optional=False)
    scen = _obj(spec.get("scenario_spec"), sf, "scenario_spec", optional=False)
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise DataError(sf, "field 'name' is missing or not text")
    stf, state = _helm_json(run, "scenario_state.json", dict)
    rstates = state.get("request_states")
    if not isinstance(rstates, list):
        raise DataError(stf, "field 'request_states' is missing or not a list")
    expected = set()
    for n, rs in enumerate(rstates):
        inst = _obj(_obj(rs, stf, f"request_states[{n}]", optional=False).get("instance"), stf,
                    f"request_states[{n}].instance", optional=False)
        expected.add(_helm_item(inst.get("id"), inst.get("perturbation"), stf, f"request_states[{n}]"))
    pf, per = _helm_json(run, "per_instance_stats.json", list)
    if not per:
        raise DataError(pf, "no per-instance stats")
    values: dict[str, dict[int, dict[str, float]]] = {}
    for n, e in enumerate(per):
        where = f"entry {n}"
        e = _obj(e, pf, where, optional=False)
        item = _helm_item(e.get("instance_id"), e.get("perturbation"), pf, where)
        trial = e.get("train_trial_index", 0)
        if isinstance(trial, bool) or not isinstance(trial, int):
            raise DataError(pf, f"{where}: train_trial_index {_short(trial, 40)} is not an integer")
        if trial in values.get(item, {}):
            raise DataError(pf, f"{where}: instance {item!r} appears twice in train trial {trial}")
        stats = e.get("stats")
        if not isinstance(stats, list):
            raise DataError(pf, f"{where}: field 'stats' is not a list")
        got = {}
        for k, st in enumerate(stats):
            st = _obj(st, pf, f"{where}.stats[{k}]", optional=False)
            sname = _obj(st.get("name"), pf, f"{where}.stats[{k}].name", optional=False).get("name")
            if not isinstance(sname, str):
                raise DataError(pf, f"{where}.stats[{k}]: stat name is not text")
            got[sname] = st
        values.setdefault(item, {})[trial] = got
    names = sorted(set.intersection(*(set(g) for t in values.values() for g in t.values())))
    m = metric or "exact_match"
    if m not in names:
        raise DataError(pf, f"unknown metric {m!r}; every instance carries {names}" if metric else
                        f"no 'exact_match' stat; choose one with --metric of {names}")
    scores = {}
    for item, trials in values.items():
        vals = []
        for trial, got in sorted(trials.items()):
            st = got[m]
            where = f"instance {item!r}, trial {trial}, stat {m!r}"
            if st.get("mean") is not None:
                vals.append(_number(st["mean"], pf, where))
            else:
                count = _number(st.get("count", 0), pf, where + " count")
                if count <= 0:
                    raise DataError(pf, f"{where}: no value (count {count:g})")
                vals.append(_number(st.get("sum"), pf, where + " sum") / count)
        scores[item] = sum(vals) / len(vals)
    missing = sorted(expected - set(scores))
    if missing:
        raise DataError(pf, f"{len(missing)} evaluated instance(s) of scenario_state.json have no stats: "
                            f"{missing[:10]}")
    model = adapter.get("model") or adapter.get("model_deployment")
    if not isinstance(model, str) or not model:
        raise DataError(sf, "field 'adapter_spec.model' is missing or not text")
    aug = _obj(spec.get("data_augmenter_spec"), sf, "data_augmenter_spec")
    perts = aug.get("perturbation_specs") or []
    if not isinstance(perts, list):
        raise DataError(sf, "field 'data_augmenter_spec.perturbation_specs' is not a list")
    prompt_keys = ("global_prefix", "global_suffix", "instructions", "input_prefix", "input_suffix",
                   "reference_prefix", "reference_suffix", "output_prefix", "output_suffix", "instance_prefix")
    task = name.split(":", 1)[0]
    settings = {
        "package": "helm",
        "task": task,
        "scenario_args": _fmt(scen.get("args")),
        "method": _text(adapter.get("method"), sf, "adapter_spec.method"),
        "num_fewshot": adapter.get("max_train_instances"),
        "temperature": adapter.get("temperature"),
        "max_tokens": adapter.get("max_tokens"),
        "stop_sequences": _fmt(adapter.get("stop_sequences")),
        "num_outputs": adapter.get("num_outputs"),
        "num_train_trials": adapter.get("num_train_trials"),
        "prompt_format": _fmt({k: adapter[k] for k in prompt_keys if k in adapter}),
        "perturbations": _fmt(perts),
        "metric": m,
    }
    for k in ("num_fewshot", "temperature", "max_tokens", "num_outputs", "num_train_trials"):
        v = settings[k]
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise DataError(sf, f"field 'adapter_spec' value {k}={_short(v, 40)} is not a number")
    return Run(str(run), model, benchmark_of(task, benchmark), settings, scores, m)


def import_helm(paths, metric: str | None = None, benchmark: str | None = None) -> ImportResult:
    return assemble([read_helm_run(d, metric, benchmark) for d in helm_run_dirs(paths)],
                    ", ".join(map(str, paths)))


# ---------------------------------------------------------------------------------- assemble

#: short column names for the settings (the axis columns)
_SHORT = {"num_fewshot": "shots", "chat_template": "chat", "fewshot_as_multiturn": "multiturn",
          "system_instruction": "system", "generate_config": "generate", "num_train_trials": "train_trials"}


def _item_order(kv):
    return (0, int(kv[0]), "") if kv[0].isdigit() else (1, 0, kv[0])


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
    any_refs = any(r.refs for r in runs)
    rows = []
    for r in runs:
        ax = {c: _fmt(r.settings.get(a, "")) for a, c in zip(axes, cols)}
        cfg = "-".join(ax.values()) if ax else r.settings.get("package", "run")
        for item, s in sorted(r.scores.items(), key=_item_order):
            row = {"model": r.model, "benchmark": r.benchmark, "config": cfg, "item": item, "score": s, **ax}
            if any_refs:
                row["source_id"] = r.refs.get(item)
            rows.append(row)
    table = pd.DataFrame(rows)
    return ImportResult(table, cols, constant, runs)


def import_lmeval(paths, metric: str | None = None, benchmark: str | None = None,
                  filter_name: str | None = None) -> ImportResult:
    runs = []
    for f in _lmeval_results_files(paths):
        runs += read_lmeval_run(f, metric, benchmark, filter_name)
    return assemble(runs, ", ".join(map(str, paths)))


def _inspect_log_files(p: Path) -> list:
    """A log file, or the logs of a folder as Inspect itself lists them (list_eval_logs: `.eval`
    files and time-stamped `.json` logs, recursively; an eval-set's manifests eval-set.json and
    logs.json are not logs and are not listed)."""
    from inspect_ai.log import list_eval_logs  # deferred: inspect_ai is optional (harness extra)

    if not p.exists():
        raise DataError(p, "not found")
    if not p.is_dir():
        return [p]
    try:
        found = list_eval_logs(str(p), descending=False)
    except Exception as exc:  # noqa: BLE001 - a filesystem listing error
        raise DataError(p, f"cannot list Inspect logs: {exc}") from None
    if not found:
        raise DataError(p, "no Inspect logs (*.eval, time-stamped *.json) in this folder")
    return sorted(found, key=lambda info: info.name)


def import_inspect(logs, metric: str | None = None, benchmark: str | None = None) -> ImportResult:
    files = [f for p in map(Path, logs) for f in _inspect_log_files(p)]
    return assemble([read_inspect_log(f, metric, benchmark) for f in files], ", ".join(map(str, logs)))


def summary(res: ImportResult, out: Path | None = None) -> dict:
    """What an import read and wrote (``safetyrepro import ... --json``)."""
    t = res.table
    runs = sorted({r.source for r in res.runs})
    return {
        "output": str(out) if out else None,
        "runs": runs, "n_runs": len(runs),
        "tasks": sorted({str(r.settings.get("task")) for r in res.runs}),
        "benchmarks": sorted(t["benchmark"].unique().tolist()),
        "filters": sorted({str(r.settings["filter"]) for r in res.runs if "filter" in r.settings}),
        "metrics": sorted({r.metric for r in res.runs}),
        "models": sorted(t["model"].unique().tolist()),
        "configs": sorted(t["config"].unique().tolist()),
        "n_items": int(t.groupby("benchmark")["item"].nunique().sum()),
        "n_rows": int(len(t)),
        "axes": list(res.axes),
        "constant": dict(res.constant),
    }
