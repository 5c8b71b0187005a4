"""What a loaded model lets the engine do, answered once per call and passed down.

Three questions decide the engine's layout; each used to be asked where it was needed
(partly through a context variable). :meth:`Capabilities.of` answers them for one call:

* ``window_as_full``: the model has sliding-window layers (Gemma-3: 512 positions), but every
  position of the call (longest prompt plus new tokens) stays inside the window, so those
  layers attend exactly like full attention and the call's caches are built with full layers
  only. Only for models whose other layers attend fully and whose attention takes 4D masks.
* ``mask_4d``: the model's attention takes an arbitrary 4D mask and a boolean
  ``logits_to_keep``, and its caches are plain per-layer caches (no sliding window, or one
  treated as full): packed prefill and stream columns.
* ``detached_prefix``: additionally, the model runs the engine's attention
  (:data:`.attention.ENGINE_NAMES`), so a batch can attend to a shared prefix kept outside its cache.
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

