"""The resampling behind every item-level p-value and noise reference: under "the models
are exchangeable item by item", an item's score vectors may be swapped between models jointly.

Two models: a paired sign flip per item, all 2^k flips enumerated when 2^k <= ``EXACT_MAX`` (an
exact test), else B random flips with p = (1 + #{T* >= T}) / (B + 1). Several models: random
permutations of the models within each item. Draws come from seeded streams keyed by benchmark
(and pair), so a number does not depend on the rest of the table; :func:`auto_samples` picks B
so the smallest attainable p is at most alpha / 20 after the correction.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

EXACT_MAX = 2 ** 14          # enumerate every sign flip up to this many patterns
DEFAULT_SAMPLES = 2000       # Monte-Carlo draws unless a larger resolution is needed
RESOLUTION_MARGIN = 20       # the smallest attainable p must be <= alpha / this


def stream(seed: int, *key: str) -> np.random.Generator:
    """The seeded stream of one (benchmark[, pair]) key, independent of every other key."""
    if int(seed) < 0:
        raise ValueError(f"the resampling seed must be >= 0 (got {seed})")
    return np.random.default_rng(np.random.SeedSequence([int(seed)] + [zlib.crc32(k.encode()) for k in key]))


def auto_samples(alpha: float, family_size: int, correction: str) -> int:
    """B such that the smallest attainable corrected p is <= alpha / RESOLUTION_MARGIN:
    max-T: 1/(B+1); Holm: |family| / (B+1)."""
    need = RESOLUTION_MARGIN * (family_size if correction == "holm" else 1) / alpha
    return max(DEFAULT_SAMPLES, int(math.ceil(need)))


@dataclass(frozen=True)
class Draws:
    """Sign flips (n_draws, k) of k items, or model permutations (n_draws, items, models)."""

    kind: str                 # exact | monte_carlo
    values: np.ndarray
    samples: int              # B (monte_carlo) or the number of patterns (exact)

    def p_value(self, at_least: np.ndarray) -> np.ndarray:
        """p from the count of draws at least as extreme as the observation."""
        at_least = np.asarray(at_least, dtype=float)
        if self.kind == "exact":
            return at_least / self.samples
        return (1.0 + at_least) / (self.samples + 1.0)

    @property
    def min_p(self) -> float:
        """The smallest p a count can give (exact: a pattern and its mirror are the extremes)."""
        return 2.0 / self.samples if self.kind == "exact" else 1.0 / (self.samples + 1.0)

    def describe(self) -> str:
        if self.kind == "exact":
            return f"exact: all {self.samples} sign flips of {self.values.shape[1]} items"
        return f"monte_carlo: {self.samples} draws"


def sign_flips(k: int, samples: int, rng: np.random.Generator) -> Draws:
    """Every flip of k items when 2^k <= EXACT_MAX, else ``samples`` random ones (+-1)."""
    if k <= int(math.log2(EXACT_MAX)):
        n = 1 << k
        bits = (np.arange(n, dtype=np.int64)[:, None] >> np.arange(k, dtype=np.int64)) & 1
        return Draws("exact", (1 - 2 * bits).astype(float), n)
    return Draws("monte_carlo", rng.choice(np.array([-1.0, 1.0]), size=(samples, k)), samples)


def model_permutations(n_items: int, n_models: int, samples: int, rng: np.random.Generator) -> Draws:
    """``samples`` draws of an independent random permutation of the models in every item."""
    base = np.broadcast_to(np.arange(n_models, dtype=np.int64), (samples, n_items, n_models))
    return Draws("monte_carlo", rng.permuted(base, axis=2), samples)
