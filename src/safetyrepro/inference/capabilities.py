"""What a loaded model lets the engine do, answered once per call and passed down.

:meth:`Capabilities.of` answers: ``window_as_full`` (sliding-window layers attend like full
attention because the whole call fits the window), ``window_mask`` (a call past the window on a
model that takes one mask per layer kind: the engine builds the sliding layers' masks itself,
from position ids, over full caches), ``mask_4d`` (the attention takes an arbitrary 4D mask and
a boolean ``logits_to_keep`` over plain per-layer caches: packed prefill, stream columns),
``detached_prefix`` (additionally the engine's attention, :data:`.attention.ENGINE_NAMES`: a
shared prefix kept outside the batch caches) and ``pad_after_prefix`` (rows may be padded
between a shared prefix and their own tokens).

Why the last: a sliding-window layer that builds its own mask measures the window in cache
columns, not positions. Padding between a shared prefix and a shorter row's suffix then pushes
prefix keys that are within the window (by position) out of it, and the row computes something
else than it would alone. Where the engine cannot mask by position (no ``window_mask``) a call
past the window shares no prefix: its rows are padded on the left only.
"""

from __future__ import annotations

from dataclasses import dataclass

from .attention import ENGINE_NAMES
from .attention import attn_implementation
from .packing import packed_supported, sliding_window


# Past a sliding window, mask the sliding layers by position where the model allows it (the
# default; benchmarks/bench_window_masks.py times it against the fallback without a prefix)
WINDOW_MASKS = True


@dataclass(frozen=True)
class Capabilities:
    mask_4d: bool
    detached_prefix: bool
    window_as_full: bool
    window_mask: bool = False
    pad_after_prefix: bool = True

    @classmethod
    def of(cls, lm, max_positions: int | None = None, *, window_full: bool = True,
           window_masks: bool | None = None) -> "Capabilities":
        """The capabilities of ``lm`` for a call whose positions stay below ``max_positions``
        (None: unknown, so sliding windows stay windows); ``window_full=False`` never treats a
        window as full attention, ``window_masks=False`` never builds the window's masks
        (None: :data:`WINDOW_MASKS`)."""
        window_masks = WINDOW_MASKS if window_masks is None else window_masks
        window = sliding_window(lm.model.config)
        as_full = (window_full and max_positions is not None and window is not None
                   and 0 < int(max_positions) <= window and packed_supported(lm, window))
        beyond = window is not None and (max_positions is None or int(max_positions) > window)
        by_mask = (window_masks and beyond and bool(window) and packed_supported(lm, 1)
                   and _masks_per_layer_kind(lm))
        mask_4d = packed_supported(lm, 1) and (window is None or as_full or by_mask)
        detached = mask_4d and not by_mask and attn_implementation(lm.model) in ENGINE_NAMES
        return cls(mask_4d=bool(mask_4d), detached_prefix=bool(detached),
                   window_as_full=bool(as_full), window_mask=bool(by_mask),
                   pad_after_prefix=not (beyond and not by_mask))


def _masks_per_layer_kind(lm) -> bool:
    """Whether ``lm`` takes ``attention_mask`` as ``{layer kind: 4D mask}`` (transformers'
    models whose config lists ``layer_types`` pass such a dict through to their layers)."""
    get = getattr(lm.model.config, "get_text_config", None)
    config = get() if callable(get) else lm.model.config
    return bool(getattr(config, "layer_types", None))

