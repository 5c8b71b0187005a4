"""Models: preparation (download / verify / convert, :mod:`.prepare`), loading with a
quantisation on a device (:mod:`.load`) and chat formatting (:mod:`.chat`)."""

from .chat import format_prompt, format_prompt_parts
from .load import LoadedModel, load_model
from .prepare import prepare_model, weights_hash

__all__ = ["prepare_model", "weights_hash", "load_model", "LoadedModel", "format_prompt",
           "format_prompt_parts"]
