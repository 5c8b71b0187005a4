"""The cross-package stage: the nominal configuration scored by several evaluation packages on
the run's own items and model folders, and how far their scores and orderings disagree.

Packages (docs/CROSS_PACKAGE.md): the run's own nominal cells, lm-eval's own task definitions
with only the data source switched, and Inspect's ``multiple_choice`` solver with its
``choice`` scorer. Per (package, benchmark, model): the score, the object scored, a prompt hash
and the per-item agreement with the nominal free-form cell; per benchmark: the spread across
packages and whether the model ordering changes.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pandas as pd

from ..analysis.common import output_metadata
from ..analysis.outputs import cross_package_files
from ..errors import DataError
from ..grid import config_of
from ..io import read_metadata, write_csv, write_parquet
from ..items import read_items
from ..models.load import compute_threads, load_model, resolve_device
from ..models.prepare import prepare_model
from ..provenance import code_version_string
from ..runtime import RuntimeSettings
from ..sysutil import package_version
from ..tasks import load_task
from .inspect_tasks import LETTERS, _task, write_inspect_data
from .localdata import write_lmeval_task

#: benchmarks each package scores here
LMEVAL_BENCHMARKS = ("truthfulqa", "bbq", "crows_pairs")
INSPECT_BENCHMARKS = ("truthfulqa", "bbq")

OBJECTS = {
    ("lm-eval", "truthfulqa"): "lm-eval truthfulqa_mc1: fixed 6-example 'Q:/A:' preamble, question, 'A:'; "
                               "candidates = MC1 answer texts (leading space); acc = argmax summed log-likelihood; "
                               "no chat template",
    ("lm-eval", "bbq"): "lm-eval bbq (multiple_choice): context, 'Q: question', 'A:'; candidates = the two "
                        "non-unknown answers + HELM's ten unknown phrasings; acc = argmax summed log-likelihood "
                        "(any unknown phrasing is correct for an unknown-gold item); no chat template",
    ("lm-eval", "crows_pairs"): "lm-eval crows_pairs_english: the two sentences scored as whole texts; "
                                "pct_stereotype = share preferring the more stereotypical one; reported here "
                                "as 1 - pct_stereotype (the run's anti-stereotype share)",
    ("inspect", "truthfulqa"): "Inspect multiple_choice + choice: 'Answer the following multiple choice question' "
                               "template with 'A) ...' options, chat template, greedy generation; "
                               "correct iff the parsed 'ANSWER: X' letter is the gold letter",
    ("inspect", "bbq"): "Inspect multiple_choice + choice over context + question and the three answers; "
                        "chat template, greedy generation; correct iff the parsed letter is the gold letter",
}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# ------------------------------------------------------------------------------ SafetyRepro


def safetyrepro_rows(sources: list[tuple[pd.DataFrame, str, str]], items: dict, nominal: str,
                     code_version: str, compute_of=None) -> tuple[list, dict]:
    """Rows for the run's own nominal cells (free-form and its logprob twin) and the chosen
    option per (benchmark, model, item) of the free-form cell (the agreement reference).

    ``sources``: ``(item_results, variant, path)`` in order of preference; each (cell,
    benchmark, model) comes from the first table that has it (the stage passes the bf16
    precision check's results first, :meth:`safetyrepro.plan.Plan.nominal_bf16_configs`).
    Every row records its ``precision`` and its source; ``compute_of(quantization)`` gives the
    arithmetic its cells ran in (the run's ``RuntimeSettings.compute_dtype``, which is in every
    cell's fingerprint), recorded as ``compute``."""
    for ir, _, path in sources:
        missing = {"config", "seed", "benchmark", "model", "item_id", "correct", "quantization"} - set(ir.columns)
        if missing:
            raise DataError(path, f"item results lack column(s) {sorted(missing)}")
    rows, chosen_ref = [], {}
    twin = nominal.rsplit("-", 1)[0] + "-logprob"
    for cfg_id, kind in ((nominal, "freeform"), (twin, "logprob")):
        picked: dict = {}
        for ir, variant, path in sources:
            sub = ir[(ir["config"] == cfg_id) & (ir["seed"] == 0)]
            for key, g in sub.groupby(["benchmark", "model"], sort=True):
                if key not in picked:
                    picked[key] = (g, variant, path)
        for (b, m), (g, variant, path) in sorted(picked.items()):
            if b not in items:
                continue
            quants = sorted(set(g["quantization"].astype(str)))
            if len(quants) != 1:
                raise DataError(path, f"cell ({m}, {b}, {cfg_id}): items computed in several quantizations {quants}")
            task = load_task(b)
            df = items[b]
            first = df.iloc[0].to_dict()
            tid = cfg_id.split("-")[0]
            if kind == "freeform":
                msgs = task.build_messages(first, tid, [], path="freeform")
            else:
                msgs = task.logprob_request(first, tid, [])[0]
            chosen = {}
            for r in g.itertuples():
                if kind == "logprob":
                    chosen[r.item_id] = None if pd.isna(r.chosen_index) else int(r.chosen_index)
                else:
                    labels = task.candidate_labels(items[b].set_index("item_id").loc[r.item_id].to_dict()) \
                        if task.answer_kind == "choice" else None
                    lab = r.parsed_label
                    chosen[r.item_id] = labels.index(lab) if labels and lab in labels else None
            if kind == "freeform":
                chosen_ref[(b, m)] = chosen
            compute = _short_dtype(compute_of(quants[0])) if compute_of else None
            rows.append({"package": f"safetyrepro-{kind}", "version": code_version, "benchmark": b, "model": m,
                         "precision": quants[0], "compute": compute,
                         "numerics": (f"the run's {cfg_id} cell in {quants[0]}"
                                      + (f" ({compute} arithmetic) " if compute else " ")
                                      + ("(the precision check's cells, item_results_bf16)" if variant == "bf16"
                                         else "(the run's own cells, item_results)")),
                         "object": f"SafetyRepro {cfg_id}: template {tid} as chat messages "
                                   + ("(lettered options; parsed letter)" if kind == "freeform"
                                      else "(candidates as continuations; argmax log-likelihood)"),
                         "prompt_sha256": _sha(json.dumps(msgs, sort_keys=True)),
                         "first_prompt": json.dumps(msgs), "score": float(g["correct"].mean()),
                         "n_items": int(len(g)), "chosen": chosen})
    return rows, chosen_ref


# ------------------------------------------------------------------------------ lm-eval


#: how lm-eval computes its log-likelihoods (docs/CROSS_PACKAGE.md, "Cost")
LMEVAL_LOOPS = ("shared-context", "stock")


def lmeval_rows(folder: str, model: str, items: dict, fewshot: dict, work: Path, *, engine=None,
                loop: str = "shared-context", dtype: str = "bfloat16", device: str = "cpu",
                batch_size: int = 16, shots: int = 0, weights: str | None = None) -> list[dict]:
    """lm-eval's own tasks on the run's items. ``shots`` > 0 draws the exemplars from the run's
    few-shot pool (``fewshot``: benchmark -> items, first n in order); a task whose own file
    fixes ``num_fewshot`` keeps it, as lm-eval does. ``loop``: ``"shared-context"``
    (:class:`.lmeval_model.SharedContextHFLM` over the loaded ``engine``) or ``"stock"``
    (lm-eval's ``HFLM`` loading ``folder`` in ``dtype`` on ``device``; ``weights`` names the
    precision of the folder's weights where it differs from ``dtype``, see :func:`bf16_weights`)."""
    from lm_eval import simple_evaluate  # deferred: lm-eval is optional (harness extra)
    from lm_eval.models.huggingface import HFLM  # deferred: lm-eval is optional
    from lm_eval.tasks import TaskManager  # deferred: lm-eval is optional

    if loop not in LMEVAL_LOOPS:
        raise ValueError(f"loop must be one of {LMEVAL_LOOPS}, not {loop!r}")
    task_dir = work / "lmeval_tasks"
    names = {}
    for b in LMEVAL_BENCHMARKS:
        if b in items:
            names[write_lmeval_task(b, items[b], fewshot.get(b) if shots else None, task_dir)] = b
    if not names:
        return []
    if loop == "stock":
        lm = HFLM(pretrained=str(folder), device=device, dtype=dtype, batch_size=batch_size)
        precision = weights or _short_dtype(dtype)
        compute = _short_dtype(dtype)
        numerics = (f"lm-eval's HFLM loop: {precision} weights in {compute} arithmetic, one forward per "
                    f"candidate over context + candidate, log-softmax in {compute}")
    else:
        if engine is None:
            raise ValueError("the shared-context loop needs the loaded model (engine=load_model(...))")
        from .lmeval_model import SharedContextHFLM  # deferred: lm-eval (optional) and torch

        lm = SharedContextHFLM(engine, tokenizer=str(folder), batch_size=batch_size)
        precision = _short_dtype(engine.info["dtype"])
        compute = _short_dtype(engine.info.get("compute_dtype", engine.info["dtype"]))
        numerics = (f"lm-eval's requests and token ids scored by SafetyRepro's scorer: {precision} weights in "
                    f"{compute} arithmetic, each context computed once, log-softmax in fp32")
    out = simple_evaluate(model=lm, tasks=sorted(names), num_fewshot=shots or None, log_samples=True,
                          task_manager=TaskManager(include_path=str(task_dir), include_defaults=False), bootstrap_iters=0)
    version = package_version("lm_eval")
    rows = []
    for task, b in names.items():
        samples = out["samples"][task]
        ids = items[b]["item_id"].tolist()
        chosen, per_item = {}, []
        for s in samples:
            iid = s["doc"]["item_id"]
            lls = [float(r[0]) for r in s["filtered_resps"]]
            if b == "crows_pairs":
                # sentence scores [more, less]: the model prefers the stereotypical one iff ll_more > ll_less
                v = 1.0 - float(s["pct_stereotype"])
                chosen[iid] = 0 if lls[0] > lls[1] else 1
            else:
                v = float(s["acc"])
                j = max(range(len(lls)), key=lls.__getitem__)
                chosen[iid] = _lmeval_choice_to_run(b, s["doc"], j, items[b])
            per_item.append(v)
        if sorted(chosen) != sorted(ids):
            raise DataError(task_dir / f"{task}.yaml", f"lm-eval scored {len(chosen)} items, the run has {len(ids)}")
        first = _first_context(samples[0]["arguments"])
        rows.append({"package": "lm-eval", "version": version, "benchmark": b, "model": model,
                     "precision": precision, "compute": compute, "numerics": numerics,
                     "object": OBJECTS[("lm-eval", b)], "prompt_sha256": _sha(first), "first_prompt": first,
                     "score": sum(per_item) / len(per_item), "n_items": len(per_item), "chosen": chosen})
    return rows


def bf16_weights(folder: Path, dest: Path) -> Path:
    """A copy of model ``folder`` with its weights rounded to bf16 and stored so, for a package
    that loads a folder in float32 to run the bf16 model in float32 arithmetic (what the run's
    own bf16 cells do on a CPU without native bf16). Tokenizer and other files are linked."""
    import torch  # deferred: torch and transformers, only where this copy is needed
    from transformers import AutoModelForCausalLM  # deferred: as torch above

    folder, dest = Path(folder), Path(dest)
    done = dest / ".complete"
    # the source folder and its weight files as they are now: a re-prepared folder is copied again
    stamp = json.dumps([str(folder.resolve())] + sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns)
                                                      for f in folder.iterdir() if f.is_file()))
    if done.exists() and done.read_text() == stamp:
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    model.save_pretrained(dest)
    del model
    gc.collect()
    for f in folder.iterdir():
        if f.is_file() and not (dest / f.name).exists() and not f.name.endswith((".safetensors", ".bin")) \
                and f.name != "model.safetensors.index.json":
            (dest / f.name).symlink_to(f.resolve())
    done.write_text(stamp)
    return dest


def _short_dtype(name: str) -> str:
    """``"bfloat16"`` / ``torch.bfloat16`` -> ``"bf16"`` (also fp32, fp16; else unchanged)."""
    name = str(name).replace("torch.", "")
    return {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}.get(name, name)


def _first_context(args) -> str:
    """The context of a sample's first request (in memory: a list of (context, continuation)
    tuples; in lm-eval's samples files: {"gen_args_0": {"arg_0": ...}})."""
    ctx, cont = ((args["gen_args_0"]["arg_0"], args["gen_args_0"]["arg_1"]) if isinstance(args, dict)
                 else (args[0][0], args[0][1]))
    # a task with an empty context (CrowS-Pairs scores whole sentences): the first scored text
    return ctx if ctx else ctx + cont


def _lmeval_choice_to_run(b: str, doc: dict, j: int, items: pd.DataFrame) -> int | None:
    """lm-eval's option index -> the run's option index (by option text)."""
    row = items.set_index("item_id").loc[doc["item_id"]]
    choices = list(row["choices"])
    if b == "truthfulqa":
        text = doc["mc1_targets"]["choices"][j]
    else:
        # lm-eval's BBQ candidates: the two non-unknown answers, then every "unknown" phrasing of
        # HELM's list; any of those stands for the item's own unknown option
        from lm_eval.tasks.bbq.utils import UNKNOWN_RESPONSES, doc_to_choice  # deferred: lm-eval is optional

        text = doc_to_choice(doc)[j]
        if text in UNKNOWN_RESPONSES:
            unknown = [i for i, c in enumerate(choices) if c in UNKNOWN_RESPONSES]
            return unknown[0] if len(unknown) == 1 else None
    return choices.index(text) if text in choices else None


# ------------------------------------------------------------------------------ Inspect


def inspect_rows(folder: str, model: str, items: dict, work: Path, max_tokens: int = 8,
                 device: str = "cpu", dtype: str = "bfloat16", weights: str = "bf16") -> list[dict]:
    """Inspect's ``multiple_choice`` + ``choice`` on the run's choice items: every benchmark a
    task of ONE ``inspect_ai.eval`` call, so Inspect's HF provider loads the model once, from
    ``folder`` in ``dtype`` (``weights``: the precision of the values the folder holds)."""
    from inspect_ai import eval as inspect_eval  # deferred: inspect_ai is optional (harness extra)

    version = package_version("inspect_ai")
    benches = [b for b in INSPECT_BENCHMARKS if b in items]
    if not benches:
        return []
    tasks = [_task(str(write_inspect_data(items[b], work / "inspect_data" / f"{b}.jsonl")), max_tokens=max_tokens,
                   name=f"safetyrepro_{b}") for b in benches]
    # Inspect's HF provider batches queued requests, up to max_connections of them, and waits
    # 2 s for more before generating a batch that is not full: one task's items fill it exactly
    logs = inspect_eval(tasks, model=f"hf/{model}", display="none", log_dir=str(work / "inspect_logs"),
                        model_args={"model_path": str(folder), "device": device, "do_sample": False,
                                    "dtype": dtype},
                        max_connections=max(len(items[b]) for b in benches))
    compute = _short_dtype(dtype)
    by_task = {log.eval.task: log for log in logs}
    rows = []
    for b in benches:
        log = by_task.get(f"safetyrepro_{b}")
        if log is None or log.status != "success":
            raise DataError(work / "inspect_logs", f"Inspect eval of {model} on {b} failed: "
                                                   f"{log.error if log is not None else 'no log for the task'}")
        chosen, vals = {}, []
        for s in log.samples:
            sc = s.scores["choice"]
            vals.append(1.0 if sc.value == "C" else 0.0)
            ans = (sc.answer or "").strip()
            chosen[str(s.id)] = LETTERS.index(ans) if len(ans) == 1 and ans in LETTERS else None
        first = json.dumps([{"role": m.role, "content": m.text} for m in log.samples[0].messages
                            if m.role != "assistant"])
        rows.append({"package": "inspect", "version": version, "benchmark": b, "model": model,
                     "precision": weights, "compute": compute,
                     "numerics": f"Inspect's HF provider: transformers generate (greedy), {weights} weights in "
                                 f"{compute} arithmetic",
                     "object": OBJECTS[("inspect", b)], "prompt_sha256": _sha(first), "first_prompt": first,
                     "score": sum(vals) / len(vals), "n_items": len(vals), "chosen": chosen})
    return rows


# ------------------------------------------------------------------------------ table


def item_table(rows: list[dict]) -> pd.DataFrame:
    """Per (package, benchmark, model, item): the option chosen, in the run's option order
    (CrowS-Pairs: 0 = the more stereotypical sentence); null where none could be read."""
    out = [{"package": r["package"], "benchmark": r["benchmark"], "model": r["model"], "item_id": i,
            "chosen_index": c} for r in rows for i, c in sorted(r["chosen"].items())]
    return pd.DataFrame(out, columns=["package", "benchmark", "model", "item_id", "chosen_index"]).astype(
        {"chosen_index": "Int64"})


def cross_package_table(rows: list[dict], chosen_ref: dict) -> pd.DataFrame:
    """Rows -> the table with per-item agreement, per-benchmark spread and ordering change."""
    out = []
    for r in rows:
        ref = chosen_ref.get((r["benchmark"], r["model"]))
        agree = n = None
        if ref is not None and r["benchmark"] != "crows_pairs":
            common = [i for i in r["chosen"] if i in ref]
            n = len(common)
            agree = (sum(r["chosen"][i] is not None and r["chosen"][i] == ref[i] for i in common) / n) if n else None
        out.append({k: v for k, v in r.items() if k != "chosen"} | {"agreement": agree, "agreement_items": n})
    df = pd.DataFrame(out)
    if df.empty:
        return df
    spread_m = df.groupby(["benchmark", "model"])["score"].agg(lambda s: 100 * (s.max() - s.min()))
    df["spread_model_pp"] = [spread_m[(b, m)] for b, m in zip(df["benchmark"], df["model"])]
    df["spread_pp"] = df.groupby("benchmark")["spread_model_pp"].transform("max")
    change = {}
    for b, g in df.groupby("benchmark"):
        orders = set()
        for p, gp in g.groupby("package"):
            if gp["model"].nunique() == g["model"].nunique():
                s = gp.set_index("model")["score"]
                # pairwise signs (ties kept as 0): the ordering as a set of relations
                ms = sorted(s.index)
                orders.add(tuple(int(s[a] > s[c]) - int(s[a] < s[c]) for a in ms for c in ms if a < c))
        change[b] = len(orders) > 1
    df["ordering_changes"] = df["benchmark"].map(change)
    return df.sort_values(["benchmark", "model", "package"]).reset_index(drop=True)


def run_stage(cfg, items_dir: Path, item_results: Path, out: Path, work: Path,
              models: list[str] | None = None, benchmarks: list[str] | None = None,
              packages: tuple[str, ...] = ("lm-eval", "inspect"), figure: Path | None = None,
              item_results_bf16: Path | None = None, lmeval_loop: str = "shared-context") -> pd.DataFrame:
    """Score the nominal configuration in every package; write ``out`` (.parquet) and a .csv.

    ``item_results_bf16``: the precision check's item results (``aggregate_bf16``); the
    SafetyRepro rows take their cells from it where it has them (:func:`safetyrepro_rows`).
    ``lmeval_loop``: see :func:`lmeval_rows`. lm-eval and Inspect run each model with bf16
    weights on the run's device (``runtime.device``), in the arithmetic the run's bf16 cells
    use there (``runtime.cpu_compute_dtype``: float32 on a CPU without native bf16)."""
    import torch  # deferred: torch; the table and figure helpers run without it

    os.environ.setdefault("HF_HUB_OFFLINE", "1")        # local folders only: no hub look-ups
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    # every core this process may use, as the cell workers do: under Snakemake a single-core
    # job inherits OMP_NUM_THREADS=1 (the stage then ran on one of this machine's two cores)
    torch.set_num_threads(compute_threads(cfg))
    t0 = time.perf_counter()
    nominal = cfg.section("analysis").get("nominal_config", "T1-greedy-k0-freeform")
    benches = [b for b in (benchmarks or cfg.benchmarks) if b in set(LMEVAL_BENCHMARKS) | set(INSPECT_BENCHMARKS)]
    items = {b: read_items(Path(items_dir) / f"{b}.parquet")[0] for b in benches}
    nom = config_of(cfg.rules, nominal)
    shots = int(str(nom.shots).lstrip("k"))
    if nom.decoding != "greedy":
        raise DataError(item_results, f"analysis.nominal_config {nominal!r}: the cross-package stage runs greedy "
                                      "decoding only (lm-eval's log-likelihood tasks have no sampling)")
    fewshot = ({b: read_items(Path(items_dir) / f"{b}.fewshot.parquet")[0] for b in benches} if shots else {})
    if shots and "inspect" in packages:
        raise DataError(item_results, f"analysis.nominal_config {nominal!r} has {shots} shots; the stage's Inspect "
                                      "task has no few-shot exemplars (use --package lm-eval)")
    sources = [(pd.read_parquet(p), v, p) for p, v in ((item_results_bf16, "bf16"), (item_results, "main")) if p]
    runtime = RuntimeSettings.from_config(cfg)
    rows, ref = safetyrepro_rows(sources, items, nominal, code_version_string(), compute_of=runtime.compute_dtype)
    device = resolve_device(cfg.section("runtime").get("device", "auto"))
    # the other packages run the bf16 model in the arithmetic the run's bf16 cells ran in: on a
    # CPU without native bf16 that is float32 over bf16-rounded weights (runtime.cpu_compute_dtype)
    compute = runtime.compute_dtype("bf16")
    timings = {}
    for m in models or cfg.models:
        folder = prepare_model(cfg, m, progress=False)
        hf_folder = bf16_weights(folder, Path(work) / m / "bf16_weights") if compute == "float32" else folder
        if "lm-eval" in packages:
            t = time.perf_counter()
            engine = load_model(cfg, m, quantization="bf16") if lmeval_loop == "shared-context" else None
            rows += lmeval_rows(str(hf_folder), m, items, fewshot, Path(work) / m, engine=engine, loop=lmeval_loop,
                                device=device, shots=shots, dtype=compute, weights="bf16")
            del engine
            gc.collect()
            timings[f"lm-eval/{m}"] = time.perf_counter() - t
        if "inspect" in packages:
            t = time.perf_counter()
            rows += inspect_rows(str(hf_folder), m, items, Path(work) / m, device=device, dtype=compute)
            timings[f"inspect/{m}"] = time.perf_counter() - t
        if hf_folder != folder:
            shutil.rmtree(hf_folder)   # ~0.25-1.2 GB a model; rewritten in seconds when needed again
    df = cross_package_table(rows, ref)
    inputs = [(Path(p), read_metadata(p)) for p in (item_results, item_results_bf16) if p]
    meta = output_metadata("cross_package", inputs,
                           extra={"nominal_config": nominal, "lmeval_loop": lmeval_loop,
                                  "torch_threads": torch.get_num_threads(),
                                  "precision": "per row: columns precision and numerics",
                                  "packages": {"lm-eval": package_version("lm_eval"), "inspect_ai": package_version("inspect_ai")},
                                  "timings_s": timings, "seconds": time.perf_counter() - t0},
                           producer="safetyrepro.crosspkg.stage")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    files = cross_package_files(out)
    write_parquet(df, files["table"], meta)
    write_csv(df, files["csv"])
    write_parquet(item_table(rows), files["per_item"], meta | {"table": "cross_package_items"})
    if figure is not None:
        plot_cross_package(df, figure)
    return df


def plot_cross_package(df: pd.DataFrame, path: Path) -> Path:
    """Write :func:`cross_package_figure` to ``path``."""
    import matplotlib.pyplot as plt  # deferred: matplotlib; only drawing needs it

    fig = cross_package_figure(df)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def cross_package_figure(df: pd.DataFrame):
    """Per benchmark: each model's score in each package (grouped bars), spread in the title."""
    import matplotlib  # deferred: matplotlib; Agg set before pyplot loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: after matplotlib.use("Agg")

    benches = sorted(df["benchmark"].unique())
    # one colour and slot per package across all panels (a benchmark some package lacks keeps
    # the others' colours); a score of 0 is drawn as a thin bar so that it stays visible
    pkgs = sorted(df["package"].unique())
    colours = {p: f"C{k}" for k, p in enumerate(pkgs)}
    fig, axes = plt.subplots(1, max(1, len(benches)), figsize=(4.2 * max(1, len(benches)), 3.6), squeeze=False)
    for ax, b in zip(axes[0], benches):
        g = df[df["benchmark"] == b]
        models, here = sorted(g["model"].unique()), [p for p in pkgs if p in set(g["package"])]
        w = 0.8 / len(here)
        for k, p in enumerate(here):
            s = g[g["package"] == p].set_index("model")["score"]
            vals = [s.get(m, float("nan")) for m in models]
            ax.bar([i + k * w for i in range(len(models))], [max(v, 0.005) for v in vals], w, color=colours[p],
                   label=p)
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(models))], models, rotation=20, fontsize=7)
        ax.set_ylim(0, 1)
        ax.set_title(f"{b}: spread {g['spread_pp'].iloc[0]:.1f} pp"
                     + (", ordering changes" if bool(g["ordering_changes"].iloc[0]) else ""), fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[p]) for p in pkgs]
    axes[0][-1].legend(handles, pkgs, fontsize=7)
    axes[0][0].set_ylabel("score (nominal config)")
    fig.tight_layout()
    return fig
