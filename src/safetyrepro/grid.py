"""Enumerate the evaluation grid: configs per benchmark, (model, benchmark, config) cells and
(model, benchmark, config, seed) jobs, each with a stable readable id.

A *config* is one level per axis, e.g. ``T2-t0.3-k3-freeform`` (template-decoding-shots-
scoring). Validity and tiers come from the rules file (:mod:`safetyrepro.rules`)."""

from __future__ import annotations

import itertools
from typing import Callable
from dataclasses import dataclass

from .rules import AXES, Rules


@dataclass(frozen=True, order=True)
class Config:
    template: str
    decoding: str
    shots: str
    scoring: str

    @property
    def id(self) -> str:
        return f"{self.template}-{self.decoding}-{self.shots}-{self.scoring}"

    def levels(self) -> dict[str, str]:
        return {a: getattr(self, a) for a in AXES}

    @classmethod
    def parse(cls, config_id: str) -> "Config":
        parts = config_id.split("-")
        if len(parts) != 4:
            raise ValueError(f"config id {config_id!r} is not template-decoding-shots-scoring")
        return cls(*parts)


@dataclass(frozen=True)
class Job:
    model: str
    benchmark: str
    config: Config
    seed: int

    @property
    def id(self) -> str:
        return f"{self.model}/{self.benchmark}/{self.config.id}/s{self.seed}"


_INDEX: dict[str, dict[str, Config]] = {}  # rules stamp -> config_index


def config_index(rules: Rules) -> dict[str, Config]:
    """Every config the rules' axis levels can form (valid for some benchmark or not), by id:
    the one mapping from a config id to its :class:`Config` (the plan and :func:`config_of`
    look ids up here). Built once per rules file content (its stamp)."""
    if rules.stamp not in _INDEX:
        levels = [[lv["id"] for lv in rules.levels(a)] for a in AXES]
        _INDEX[rules.stamp] = {c.id: c for c in (Config(*combo) for combo in itertools.product(*levels))}
    return _INDEX[rules.stamp]


def config_of(rules: Rules, config_id: str) -> Config:
    """The :class:`Config` of ``config_id`` under ``rules``: ValueError naming the rules file
    for an id that is not template-decoding-shots-scoring of its levels. Code that has the
    rules looks ids up here (:meth:`Config.parse` only splits an id, for tables certified
    without a rules file)."""
    try:
        return config_index(rules)[config_id]
    except KeyError:
        raise ValueError(f"config id {config_id!r} is not template-decoding-shots-scoring of the "
                         f"levels of the rules {rules.path}") from None


def configs(rules: Rules, benchmark: str, envelope: str = "full") -> list[Config]:
    """Valid configs of ``benchmark`` in the named sub-envelope, in a stable order."""
    out = []
    for cfg in config_index(rules).values():
        lv = cfg.levels()
        if rules.is_valid(benchmark, lv) and rules.in_sub_envelope(envelope, lv):
            out.append(cfg)
    return out


PRECISION_ENVELOPE = "conservative_core"


def precision_configs(rules: Rules, benchmark: str, envelope: str = PRECISION_ENVELOPE) -> list[Config]:
    """The configs of ``benchmark`` the BF16 vs NF4 precision check compares: the sub-envelope's
    valid configs, or, for a benchmark with none (CrowS-Pairs: logprob only, while the
    conservative core is free-form), the sub-envelope's zero-shot configs with its own scoring,
    as the harnesses that ship it score it zero-shot (docs/VERDICTS.md section 8)."""
    own = configs(rules, benchmark, envelope)
    if own:
        return own
    zero_shot = {lv["id"] for lv in rules.levels("shots") if lv["n"] == 0}
    scorings = [lv["id"] for lv in rules.levels("scoring")]
    out = []
    for cfg in config_index(rules).values():
        lv = cfg.levels()
        if (cfg.shots in zero_shot and rules.is_valid(benchmark, lv)
                and any(rules.in_sub_envelope(envelope, {**lv, "scoring": s}) for s in scorings)):
            out.append(cfg)
    return out


SeedCount = Callable[[str], int]  # decoding id -> number of seeds


def seeds_for(rules: Rules, cfg: Config, n_seeds: SeedCount | None = None) -> list[int]:
    return list(range((n_seeds or rules.n_seeds)(cfg.decoding)))


def config_tiers(rules: Rules, cfg: Config) -> dict[str, str]:
    return {a: rules.tier(a, getattr(cfg, a)) for a in AXES}


def is_core(rules: Rules, cfg: Config) -> bool:
    return all(t == "core" for t in config_tiers(rules, cfg).values())


def cells(rules: Rules, models: list[str], benchmarks: list[str], envelope: str = "full"):
    """(model, benchmark, Config) triples."""
    return [(m, b, c) for m in models for b in benchmarks for c in configs(rules, b, envelope)]


def jobs(rules: Rules, models: list[str], benchmarks: list[str], envelope: str = "full",
         n_seeds: SeedCount | None = None) -> list[Job]:
    return [Job(m, b, c, s) for (m, b, c) in cells(rules, models, benchmarks, envelope)
            for s in seeds_for(rules, c, n_seeds)]


def summarize(rules: Rules, models: list[str], benchmarks: list[str], envelope: str = "full",
              n_seeds: SeedCount | None = None) -> dict:
    """Counts the `grid` command prints (and tests check)."""
    per_bench = {}
    for b in benchmarks:
        cs = configs(rules, b, envelope)
        per_bench[b] = {
            "configs": len(cs),
            "freeform": sum(c.scoring == "freeform" for c in cs),
            "logprob": sum(c.scoring == "logprob" for c in cs),
            "jobs_per_model": sum(len(seeds_for(rules, c, n_seeds)) for c in cs),
        }
    n_cells = len(models) * sum(v["configs"] for v in per_bench.values())
    n_jobs = len(models) * sum(v["jobs_per_model"] for v in per_bench.values())
    return {
        "envelope": envelope,
        "rules_stamp": rules.stamp,
        "rules_version": rules.version,
        "models": list(models),
        "benchmarks": per_bench,
        "cells": n_cells,
        "jobs": n_jobs,
    }



def summarize_config(cfg, envelope: str | None = None) -> dict:
    """:func:`summarize` for a RunConfig (honours its seed override), plus the config hash."""
    out = summarize(cfg.rules, cfg.models, cfg.benchmarks, envelope or cfg.envelope_name, cfg.n_seeds)
    out["config_hash"] = cfg.hash
    return out


def config_jobs(cfg, envelope: str | None = None) -> list[Job]:
    """Every (model, benchmark, config, seed) job of a RunConfig."""
    return jobs(cfg.rules, cfg.models, cfg.benchmarks, envelope or cfg.envelope_name, cfg.n_seeds)
