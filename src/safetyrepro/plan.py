"""The workflow's plan: which jobs a run config asks for and what each one is handed.

A :class:`Plan` enumerates the jobs of each variant (the envelope's cells, the precision
check's bf16 cells), their decode groups and the analysis steps, and resolves one cell into the
request its job runs (:meth:`Plan.cell_request`). Three small immutable parts do the rest and
are used directly: :attr:`Plan.layout` (paths, :mod:`.results_layout`), :attr:`Plan.runtime`
(device, compute dtype, time limits, cluster resources, :mod:`.runtime`) and
:attr:`Plan.fingerprints` (what decides when an output is stale, :mod:`.fingerprints`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path

from . import grid
from .aggregate_inputs import AggregateInputs, ShardEntry
from .analysis.outputs import TABLE_STEPS
from .cell_request import CellRequest, format_decode_group
from .config import RunConfig
from .fingerprints import Fingerprints
from .results_layout import SHARD_PATTERN, ResultsLayout
from .runtime import RuntimeSettings
from .worker.layout import make_key


def variant_quantization(cfg: RunConfig, model: str, variant: str) -> str:
    """The quantization a variant runs ``model`` in (bf16: the precision check)."""
    return "bf16" if variant == "bf16" else cfg.quantization(model)


@dataclass(frozen=True)
class GroupJobs:
    """One workflow job per decode group of a variant: every free-form decode group of the
    variant has the same members ``(decoding id, seed)`` and the groups are exactly every
    (model, benchmark, template, shots) of the four tuples. :meth:`output_patterns` are then
    the job's shard paths with those four as wildcards, so one rule declares each group's
    shards (workflow/rules/cells.smk)."""
    variant: str
    decode_group: tuple[tuple[str, int], ...]  # (decoding id, seeds): every group's, as Plan.decode_group
    models: tuple[str, ...]
    benchmarks: tuple[str, ...]
    templates: tuple[str, ...]
    shots: tuple[str, ...]

    @property
    def members(self) -> tuple[tuple[str, int], ...]:
        """Each cell of a group as (decoding id, seed), in the job's order."""
        return tuple((d, s) for d, n in self.decode_group for s in range(n))

    def config_ids(self) -> list[str]:
        """Each member's config id with ``{template}`` and ``{shots}`` left as wildcards."""
        return [grid.Config("{template}", d, "{shots}", "freeform").id for d, _ in self.members]

    def output_patterns(self, layout: ResultsLayout) -> list[str]:
        """The shard path of each member (in :attr:`members` order) with ``{shards}`` (the
        variant's shard folder), ``{model}``, ``{benchmark}``, ``{template}`` and ``{shots}`` as
        wildcards."""
        return [str(layout.results / SHARD_PATTERN.format(shards="{shards}", model="{model}",
                                                          benchmark="{benchmark}", config_id=cid,
                                                          seed=seed))
                for cid, (_, seed) in zip(self.config_ids(), self.members)]


@dataclass(eq=False, frozen=True)  # hashed by identity (lru_cache on methods)
class Plan:
    cfg: RunConfig
    layout: ResultsLayout = field(init=False)
    runtime: RuntimeSettings = field(init=False)
    fingerprints: Fingerprints = field(init=False)

    def __post_init__(self):
        # derived once from cfg (a frozen dataclass sets its own derived fields this way)
        layout = ResultsLayout(self.cfg.results_dir)
        object.__setattr__(self, "layout", layout)
        object.__setattr__(self, "runtime", RuntimeSettings.from_config(self.cfg))
        object.__setattr__(self, "fingerprints", Fingerprints(self.cfg, layout))

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
        return [str(self.layout.shard_path(j.model, j.benchmark, j.config.id, j.seed, variant)) for j in self.jobs(variant)]

    def aggregate_inputs(self, variant: str = "main") -> AggregateInputs:
        """What aggregation reads of ``variant``: every job's shard with the fingerprint it must
        carry (including the chat-template hash of the prepared-model markers), and the item
        files."""
        shards = tuple(ShardEntry(str(self.layout.shard_path(j.model, j.benchmark, j.config.id, j.seed, variant)), j.model,
                                  j.benchmark, j.config.id, j.seed,
                                  self.cell_fingerprint(j.model, j.benchmark, j.config.id, j.seed, variant))
                       for j in self.jobs(variant))
        return AggregateInputs(variant, shards, {b: str(self.layout.items_path(b)) for b in self.cfg.benchmarks})

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
        skip = {"bbq-bias"} if "bbq" not in self.cfg.benchmarks else set()
        skip |= set() if self.precision_check else {"precision"}
        skip |= set() if self.scale_probe_families else {"scale-probe"}
        return [s for s in TABLE_STEPS if s not in skip]

    # ---- model workers ----------------------------------------------------------------------
    def worker_key(self, model: str, quantization: str) -> str:
        """One worker per (model, quantization, compute dtype, linear path, model source): a
        changed source, compute dtype or linear path loads afresh."""
        return make_key(model, quantization, self.runtime.compute_dtype(quantization),
                        self.runtime.linear(quantization), self.fingerprints.source_fingerprint(model)[:12])

    # ---- fingerprints ---------------------------------------------------------------------
    def cell_fingerprint(self, model: str, benchmark: str, config_id: str, seed: int, variant: str = "main",
                         *, chat_template: bool = True) -> str:
        """What a cell's output depends on (:mod:`.fingerprints`), all known when Snakemake
        plans the run: so a change reruns exactly the cells it can affect. With
        ``chat_template`` (the default: what a shard records and aggregation expects) it
        includes the model's chat-template hash from the prepared-model marker
        (:meth:`.fingerprints.Fingerprints.cell`)."""
        quantization = self.quantization(model, variant)
        return self.fingerprints.cell(model, quantization, benchmark, self.config(config_id), seed,
                                      self.decode_group(benchmark, config_id, variant),
                                      self.runtime.compute_dtype(quantization), self.runtime.linear(quantization),
                                      chat_template=chat_template)

    def cell_request(self, model: str, benchmark: str, config_id: str, seed: int, out: str | Path,
                     variant: str = "main") -> CellRequest:
        """The resolved request of one cell (what the cell rule hands its job), with the
        fingerprint planned without the chat-template hash."""
        return CellRequest(
            model=model, variant=variant, quantization=self.quantization(model, variant), benchmark=benchmark,
            config_id=config_id, seed=int(seed), decode_group=self.decode_group(benchmark, config_id, variant),
            config_path=str(Path(self.cfg.path).resolve()), rules=str(Path(self.cfg.rules.path).resolve()),
            items=str(self.layout.items_path(benchmark).resolve()),
            fewshot=str(self.layout.fewshot_path(benchmark).resolve()),
            model_marker=str(self.layout.model_marker(model).resolve()), out=str(Path(out).resolve()),
            fingerprint=self.cell_fingerprint(model, benchmark, config_id, seed, variant, chat_template=False))

    def decode_group_arg(self, benchmark: str, config_id: str, variant: str = "main") -> str:
        """:meth:`decode_group` as the cell job's ``--decode-group`` argument."""
        return format_decode_group(self.decode_group(benchmark, config_id, variant))

    @functools.lru_cache(maxsize=None)
    def group_jobs(self, variant: str = "main") -> GroupJobs | None:
        """The variant's decode groups as one job each (:class:`GroupJobs`), where they take that
        regular form; None where the variant has no decode group of more than one cell, or its
        groups differ in members or do not cover a full product of models, benchmarks,
        templates and shots (a hand-made envelope): their cells then stay one job each.

        A group's first cell computes every cell of the group in the model's worker, so one job
        per group does the same compute as one job per cell without the hand-off of the
        others (each a Snakemake job and a client process: about 50 ms, RESULTS.md section 22)."""
        groups: dict[tuple[str, str, str, str], set[tuple[str, int]]] = {}
        shapes = set()
        for j in self.jobs(variant):
            c = j.config
            dg = self.decode_group(j.benchmark, c.id, variant)
            if c.scoring != "freeform" or sum(n for _, n in dg) < 2:
                continue
            shapes.add(dg)
            groups.setdefault((j.model, j.benchmark, c.template, c.shots), set()).add((c.decoding, j.seed))
        if len(shapes) != 1:
            return None
        axes = [tuple(dict.fromkeys(k[i] for k in groups)) for i in range(4)]
        jobs = GroupJobs(variant, shapes.pop(), *axes)
        if any(cells != set(jobs.members) for cells in groups.values()):
            return None
        if len(groups) != len(axes[0]) * len(axes[1]) * len(axes[2]) * len(axes[3]):
            return None  # not a full product: wildcards would match cells of no group
        return jobs

    def group_cells(self, variant: str, model: str, benchmark: str, template: str,
                    shots: str) -> list[tuple[str, int, str]]:
        """(config id, seed, fingerprint planned without the chat-template hash) of each cell of
        one group job, in :attr:`GroupJobs.members` order."""
        g = self.group_jobs(variant)
        if g is None or not (model in g.models and benchmark in g.benchmarks and template in g.templates
                             and shots in g.shots):
            raise ValueError(f"no group job of {variant} for {model} {benchmark} {template} {shots}")
        out = []
        for d, seed in g.members:
            cid = grid.Config(template, d, shots, "freeform").id
            out.append((cid, seed, self.cell_fingerprint(model, benchmark, cid, seed, variant,
                                                         chat_template=False)))
        return out
