"""The run config (``config/config.yaml``, ``config/paper.yaml``): load, validate, resolve.

Relative paths in a config (``envelope.rules``, ``data.local_dir``, ``runtime.resources_dir``,
``runtime.results_dir``, a local model's ``source.path``) are resolved against the folder of
the config file, so `snakemake`, the CLI and an installed package agree whatever the working
directory."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .hashing import canonical_hash
from .paths import resolve
from .rules import Rules, load_rules
from .schema import load_yaml, validate

DATA_ENV = "SAFETYREPRO_DATA"

# Every default of a run config, in one place (a model's default quantization is per model).
DEFAULT_QUANTIZATION = "nf4"
DEFAULTS: dict[str, Any] = {
    "data": {"source": "local", "local_dir": "../shared/data/benchmarks", "items_seed": 20240601},
    "generation": {"batch_size": 16, "max_new_tokens": {"T1": 8, "T2": 8, "T3": 8, "T4": 64}},
    "runtime": {"device": "auto", "resources_dir": "resources", "results_dir": "results",
                "worker_idle_timeout_s": 120, "cell_timeout_s": 7200, "device_wait_s": 1800,
                "prefill_store_mb": 2048, "grouped_attention": True, "cpu_compute_dtype": "auto",
                "cpu_linear": "packed",
                "cluster": {"mem_mb": 16000, "cell_minutes": 2}},
    "analysis": {"parse_clean_threshold": 0.95, "bootstrap_samples": 1000, "bootstrap_seed": 7,
                 "subsample_fraction": 0.8, "subsample_repeats": 20,
                 "nominal_config": "T1-greedy-k0-freeform", "precision_check": False, "alpha": 0.05,
                 "significance_family": "pair", "significance_correction": "maxt", "resampling_samples": None,
                 "cross_package": False, "cross_package_lmeval_loop": "shared-context"},
}


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


@dataclass
class RunConfig:
    path: str
    raw: dict = field(repr=False)          # as written in the file (validated)
    data: dict = field(repr=False)         # with defaults filled in
    rules: Rules = field(repr=False)

    @property
    def folder(self) -> Path:
        """The config file's folder: what relative paths in the config are relative to."""
        return config_folder(self.path)

    def resolve(self, path: str | os.PathLike) -> Path:
        """A path from the config, relative ones taken from the config file's folder
        (normalized: ``../results`` from ``<project>/config`` is ``<project>/results``)."""
        return Path(os.path.normpath(resolve(path, self.folder)))

    # ---- identity -----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.data["run_name"]

    @property
    def hash(self) -> str:
        """Hash of the effective config (defaults filled in)."""
        return canonical_hash(self.data)

    # ---- envelope -----------------------------------------------------------------------
    @property
    def envelope_name(self) -> str:
        return self.data["envelope"].get("name", "full")

    def n_seeds(self, decoding_id: str) -> int:
        if self.rules.level("decoding", decoding_id)["sampled"]:
            return self.data["envelope"].get("seeds", self.rules.content["seeds"]["sampled"])
        return self.rules.content["seeds"]["deterministic"]

    # ---- benchmarks / models ------------------------------------------------------------
    @property
    def benchmarks(self) -> list[str]:
        return list(self.data["benchmarks"])

    def benchmark(self, name: str) -> dict:
        return self.data["benchmarks"][name]

    @property
    def models(self) -> list[str]:
        return list(self.data["models"])

    def model(self, key: str) -> dict:
        if key not in self.data["models"]:
            raise ConfigError(self.path, f"models.{key}",
                              f"no such model; configured: {', '.join(self.models)}")
        return self.data["models"][key]

    def quantization(self, key: str) -> str:
        """The model's configured quantization (default :data:`DEFAULT_QUANTIZATION`)."""
        return self.model(key).get("quantization", DEFAULT_QUANTIZATION)

    # ---- paths --------------------------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        env = os.environ.get(DATA_ENV)
        return resolve(env) if env else self.resolve(self.data["data"]["local_dir"])

    @property
    def results_dir(self) -> Path:
        return self.resolve(self.data["runtime"]["results_dir"])

    @property
    def resources_dir(self) -> Path:
        return self.resolve(self.data["runtime"]["resources_dir"])

    def max_new_tokens(self, benchmark: str, template: str) -> int:
        mnt = self.data["generation"]["max_new_tokens"]
        by_b = mnt.get("by_benchmark", {}).get(benchmark, {})
        if template in by_b:
            return by_b[template]
        if template in mnt:
            return mnt[template]
        raise ConfigError(self.path, "generation.max_new_tokens",
                          f"no value for template {template!r} (benchmark {benchmark})")

    def section(self, name: str) -> dict:
        return self.data.get(name, {})


def config_folder(path: str | os.PathLike) -> Path:
    """The absolute folder of a config file (symbolic links not followed)."""
    return Path(os.path.normpath(Path(path).absolute())).parent


PATH_KEYS = (("envelope", "rules"), ("data", "local_dir"), ("runtime", "resources_dir"),
             ("runtime", "results_dir"))


def absolute_paths(raw: dict, folder: str | os.PathLike) -> dict:
    """``raw`` (a parsed config from ``folder``) with its relative paths made absolute, so a copy
    written elsewhere points at the same envelope, data, resources, results and model folders."""
    folder = Path(folder)
    for section, key in PATH_KEYS:
        value = raw.get(section, {}).get(key)
        if isinstance(value, str) and not Path(value).is_absolute():
            raw[section][key] = str((folder / value).resolve())
    for spec in raw.get("models", {}).values():
        source = spec.get("source", {}) if isinstance(spec, dict) else {}
        if source.get("kind") == "local" and not Path(source["path"]).is_absolute():
            source["path"] = str((folder / source["path"]).resolve())
    return raw


def load_config(path: str | os.PathLike) -> RunConfig:
    """Load and validate a run config (a relative ``path`` from the working directory);
    ConfigError names the file and field at fault."""
    path = Path(path)
    return config_from_dict(load_yaml(path), path)


def config_from_dict(raw: Any, path: str | os.PathLike) -> RunConfig:
    """Validate an already-parsed config (e.g. Snakemake's ``config``); ``path`` names it."""
    if not isinstance(raw, dict):
        raise ConfigError(path, None, "expected a mapping at the top level")
    validate(raw, "config", path)
    data = _merge(DEFAULTS, raw)
    rules = load_rules(os.path.normpath(resolve(data["envelope"]["rules"], config_folder(path))))
    cfg = RunConfig(path=str(path), raw=raw, data=data, rules=rules)
    _check_against_rules(cfg)
    return cfg


def _check_against_rules(cfg: RunConfig) -> None:
    env = cfg.envelope_name
    if env not in cfg.rules.sub_envelope_names:
        raise ConfigError(cfg.path, "envelope.name",
                          f"unknown sub-envelope {env!r}; {cfg.rules.path} defines "
                          f"{', '.join(cfg.rules.sub_envelope_names)}")
    unknown = set(cfg.benchmarks) - set(cfg.rules.benchmarks)
    if unknown:
        raise ConfigError(cfg.path, "benchmarks",
                          f"{sorted(unknown)} not in the rules file's benchmarks {cfg.rules.benchmarks}")
    templates = [lv["id"] for lv in cfg.rules.levels("template")]
    mnt = cfg.data["generation"]["max_new_tokens"]
    missing = [t for t in templates if t not in mnt]
    if missing:
        raise ConfigError(cfg.path, "generation.max_new_tokens", f"missing templates {missing}")
    _check_scale_probe(cfg)
    fake = [m for m in cfg.models if cfg.model(m)["source"]["kind"] == "fake"]
    if fake and cfg.section("analysis")["cross_package"]:
        raise ConfigError(cfg.path, "analysis.cross_package",
                          f"the cross-package stage loads real models; {fake} have source kind 'fake'")


def _check_scale_probe(cfg: RunConfig) -> None:
    """``analysis.scale_probe.families``: (small, large) pairs of distinct configured models,
    each family leaving at least one third model to compare against (docs/VERDICTS.md)."""
    families = (cfg.data["analysis"].get("scale_probe") or {}).get("families", [])
    seen = set()
    for i, fam in enumerate(families):
        field_ = f"analysis.scale_probe.families.{i}"
        unknown = [m for m in fam if m not in cfg.data["models"]]
        if unknown:
            raise ConfigError(cfg.path, field_, f"{unknown} not among the configured models {cfg.models}")
        if fam[0] == fam[1]:
            raise ConfigError(cfg.path, field_, f"small and large are the same model {fam[0]!r}")
        if tuple(fam) in seen:
            raise ConfigError(cfg.path, field_, "family given twice")
        seen.add(tuple(fam))
        if not set(cfg.models) - set(fam):
            raise ConfigError(cfg.path, field_, "no third model to compare the family against")
