"""The envelope rules file: axes with core/stress tiers, validity rules, seeds, sub-envelopes.

The rules are data (``config/envelope.yaml``); this module only interprets them. The *rules
stamp* is sha256 over the canonical JSON of the parsed content, so comments, whitespace and
key order do not change it but any change of a level, tier, rule or seed count does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .hashing import canonical_hash
from .paths import DEFAULT_ENVELOPE
from .schema import load_yaml, validate

AXES = ("template", "decoding", "shots", "scoring")


@dataclass(frozen=True)
class Rules:
    """Parsed envelope rules."""

    path: str
    content: dict = field(repr=False)
    stamp: str

    @property
    def version(self) -> int:
        return self.content["rules_version"]

    @property
    def benchmarks(self) -> list[str]:
        return list(self.content["benchmarks"])

    def levels(self, axis: str) -> list[dict]:
        return list(self.content["axes"][axis])

    def level(self, axis: str, level_id: str) -> dict:
        for lv in self.content["axes"][axis]:
            if lv["id"] == level_id:
                return lv
        raise KeyError(f"unknown {axis} level {level_id!r}")

    def tier(self, axis: str, level_id: str) -> str:
        return self.level(axis, level_id)["tier"]

    def n_seeds(self, decoding_id: str) -> int:
        sampled = self.level("decoding", decoding_id)["sampled"]
        return self.content["seeds"]["sampled" if sampled else "deterministic"]

    def sub_envelope(self, name: str) -> dict:
        subs = self.content["sub_envelopes"]
        if name not in subs:
            raise ConfigError(self.path, f"sub_envelopes.{name}",
                              f"unknown sub-envelope; known: {', '.join(sorted(subs))}")
        return subs[name]

    @property
    def sub_envelope_names(self) -> list[str]:
        return list(self.content["sub_envelopes"])

    def is_valid(self, benchmark: str, levels: dict[str, str]) -> bool:
        """True iff no validity rule excludes this (benchmark, config)."""
        return not self.violations(benchmark, levels)

    def violations(self, benchmark: str, levels: dict[str, str]) -> list[str]:
        values = dict(levels, benchmark=benchmark)
        broken = []
        for rule in self.content["validity"]:
            if all(values.get(k) in v for k, v in rule["when"].items()):
                if not all(values.get(k) in v for k, v in rule["require"].items()):
                    broken.append(rule["id"])
        return broken

    def in_sub_envelope(self, name: str, levels: dict[str, str]) -> bool:
        sub = self.sub_envelope(name)
        excl = set(sub.get("exclude_tiers", []))
        for axis in AXES:
            if self.tier(axis, levels[axis]) in excl:
                return False
        for axis, allowed in sub.get("include", {}).items():
            if axis != "benchmark" and levels.get(axis) not in allowed:
                return False
        return True


def _check_references(content: dict, path: str) -> None:
    """Cross-field checks the schema cannot express: unique ids, known level ids in rules."""
    known = {}
    for axis in AXES:
        ids = [lv["id"] for lv in content["axes"][axis]]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ConfigError(path, f"axes.{axis}", f"duplicate level ids: {sorted(dup)}")
        known[axis] = set(ids)
    known["benchmark"] = set(content["benchmarks"])
    for i, rule in enumerate(content["validity"]):
        for part in ("when", "require"):
            for axis, vals in rule[part].items():
                bad = set(vals) - known[axis]
                if bad:
                    raise ConfigError(path, f"validity.{i}.{part}.{axis}",
                                      f"unknown level(s) {sorted(bad)}; known: {sorted(known[axis])}")
    for name, sub in content["sub_envelopes"].items():
        for axis, vals in sub.get("include", {}).items():
            bad = set(vals) - known[axis]
            if bad:
                raise ConfigError(path, f"sub_envelopes.{name}.include.{axis}",
                                  f"unknown level(s) {sorted(bad)}; known: {sorted(known[axis])}")
    for i, lv in enumerate(content["axes"]["decoding"]):
        if lv["sampled"] != (lv["temperature"] > 0):
            raise ConfigError(path, f"axes.decoding.{i}",
                              "'sampled' must be true exactly when temperature > 0")


def rules_stamp(content: dict) -> str:
    return canonical_hash(content)


def load_rules(path: str | Path | None = None) -> Rules:
    """Load, validate and stamp the rules file (default ``config/envelope.yaml``)."""
    path = Path(path) if path is not None else DEFAULT_ENVELOPE
    content: Any = load_yaml(path)
    if not isinstance(content, dict):
        raise ConfigError(path, None, "expected a mapping at the top level")
    validate(content, "envelope", path)
    _check_references(content, str(path))
    return Rules(path=str(path), content=content, stamp=rules_stamp(content))
