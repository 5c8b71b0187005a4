"""What a loaded model lets the engine do, answered once per call and passed down.

:meth:`Capabilities.of` answers: ``window_as_full`` (sliding-window layers attend like full
attention because the whole call fits the window), ``mask_4d`` (the attention takes an
arbitrary 4D mask and a boolean ``logits_to_keep`` over plain per-layer caches: packed prefill,
stream columns) and ``detached_prefix`` (additionally the engine's attention,
:data:`.attention.ENGINE_NAMES`: a shared prefix kept outside the batch caches).
"""

from __future__ import annotations

from dataclasses import dataclass

from .attention import ENGINE_NAMES
from .attention import attn_implementation
from .packing import packed_supported, sliding_window


@dataclass(frozen=True)
class Capabilities:
    mask_4d: bool
    detached_prefix: bool
    window_as_full: bool

    @classmethod
    def of(cls, lm, max_positions: int | None = None, *, window_full: bool = True) -> "Capabilities":
        """The capabilities of ``lm`` for a call whose positions stay below ``max_positions``
        (None: unknown, so sliding windows stay windows); ``window_full=False`` never treats a
        window as full attention."""
        window = sliding_window(lm.model.config)
        as_full = (window_full and max_positions is not None and window is not None
                   and 0 < int(max_positions) <= window and packed_supported(lm, window))
        mask_4d = packed_supported(lm, 1) and (window is None or as_full)
        detached = mask_4d and attn_implementation(lm.model) in ENGINE_NAMES
        return cls(mask_4d=bool(mask_4d), detached_prefix=bool(detached), window_as_full=bool(as_full))

