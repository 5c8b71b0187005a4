"""The run's runtime settings as the workflow uses them: the device and compute dtype cells run
in, the model workers' time limits and the cluster resources of a model's cell jobs. Read
from the config's ``runtime`` section (defaults: :data:`.config.DEFAULTS`) and each model's
``cluster`` settings; resolved once, when the run is planned."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from .compute_dtype import compute_dtype, native_bf16, planned_device
from .config import RunConfig
from .models.packed_linear import resolve as resolve_linear


@dataclass(eq=False, frozen=True)
class RuntimeSettings:
    settings: Mapping[str, Any]  # the config's runtime section
    model_cluster: Mapping[str, Mapping[str, int]]  # model -> its own cluster settings

    @classmethod
    def from_config(cls, cfg: RunConfig) -> "RuntimeSettings":
        return cls(MappingProxyType(dict(cfg.section("runtime"))),
                   MappingProxyType({m: MappingProxyType(dict(cfg.model(m).get("cluster", {})))
                                     for m in cfg.models}))

    @functools.cached_property
    def device(self) -> str:
        """The device cells run on (``runtime.device``; ``auto`` asks torch)."""
        return planned_device(self.settings.get("device", "auto"))

    def compute_dtype(self, quantization: str) -> str:
        """``bfloat16`` or ``float32``: what a model quantized as ``quantization`` computes in
        (``runtime.cpu_compute_dtype``, :mod:`.compute_dtype`), resolved where the run is planned
        (a worker fingerprints with what the model it loaded computes in)."""
        return compute_dtype(self.settings["cpu_compute_dtype"], self.device, quantization)

    def linear(self, quantization: str) -> str:
        """``packed`` or ``plain``: how a model quantized as ``quantization`` runs its linear
        layers (``runtime.cpu_linear``, :mod:`.models.packed_linear`), resolved where the run is
        planned (a worker fingerprints with what the model it loaded uses)."""
        return resolve_linear(self.settings["cpu_linear"], self.device, self.compute_dtype(quantization),
                              native=self.native_bf16)

    @functools.cached_property
    def native_bf16(self) -> bool:
        """Whether this CPU multiplies bf16 natively (:func:`.compute_dtype.native_bf16`), read
        from /proc/cpuinfo once per plan rather than for every job's fingerprint."""
        return native_bf16()

    @property
    def worker_idle_timeout(self) -> float:
        return float(self.settings["worker_idle_timeout_s"])

    @property
    def cell_timeout(self) -> float:
        """Seconds a cell call may run before it fails and its worker exits (watchdog)."""
        return float(self.settings["cell_timeout_s"])

    @property
    def device_wait(self) -> float:
        """Seconds a worker waits for the device before failing, naming the holder."""
        return float(self.settings["device_wait_s"])

    def cluster_resources(self, model: str) -> dict[str, int]:
        """``mem_mb`` and ``cell_minutes`` of a model's cell jobs on a cluster: the model's
        ``cluster`` settings over ``runtime.cluster``. In a group job every cell is one
        layer (one GPU each, see profiles/slurm), so the job asks for the largest ``mem_mb``
        and the sum of its cells' minutes."""
        return {**self.settings["cluster"], **self.model_cluster[model]}
