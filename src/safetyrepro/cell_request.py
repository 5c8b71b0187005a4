"""The resolved cell: what one cell job hands its model's worker, as data.

The cell rule passes its wildcards, its declared inputs and output and what the plan
resolved (the decode group, the expected fingerprint) to the job's client
(:mod:`.cell_client`), which builds one :class:`CellRequest` and sends it to the worker;
:func:`.cells.run_cell` computes exactly that cell and opens only the files it names. This
module imports only the standard library: the client starts once per cell job."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class CellRequest:
    """One (model, benchmark, config, seed) cell of a variant, resolved.

    ``config_id``: the envelope point (template-decoding-shots-scoring), looked up in the rules
    file ``rules``; ``decode_group``: the (decoding, seeds) it is decoded with
    (:meth:`.plan.Plan.decode_group`); ``config_path``: the run config YAML (model source,
    generation and runtime settings); ``items`` / ``fewshot`` / ``model_marker``: the item
    subset, the few-shot pool and the prepared-model marker; ``out``: the shard it writes;
    ``fingerprint``: the cell fingerprint the workflow planned without the chat-template hash
    (None: not checked)."""
    model: str
    variant: str
    quantization: str
    benchmark: str
    config_id: str
    seed: int
    decode_group: tuple[tuple[str, int], ...]
    config_path: str
    rules: str
    items: str
    fewshot: str
    model_marker: str
    out: str
    fingerprint: str | None = None

    @property
    def id(self) -> str:
        return (f"{self.model}/{self.benchmark}/{self.config_id}/s{self.seed} "
                f"({self.variant}, {self.quantization})")

    def as_message(self) -> dict:
        """The request as a JSON object (what the client sends)."""
        d = asdict(self)
        d["decode_group"] = [list(g) for g in self.decode_group]
        return d

    @classmethod
    def from_message(cls, message: dict) -> "CellRequest":
        """The request a client sent (:meth:`as_message`); ValueError for a malformed one."""
        if not isinstance(message, dict):
            raise ValueError(f"a cell request is a JSON object, got {type(message).__name__}")
        names = {f.name for f in fields(cls)}
        unknown, missing = set(message) - names, {n for n in names if n != "fingerprint"} - set(message)
        if unknown or missing:
            raise ValueError(f"cell request: unknown fields {sorted(unknown)}, missing {sorted(missing)}")
        try:
            group = tuple((str(d), int(n)) for d, n in message["decode_group"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cell request: decode_group {message['decode_group']!r} is not "
                             "[[decoding, seeds], ...]") from exc
        return cls(**{**message, "seed": int(message["seed"]), "decode_group": group})


def format_decode_group(group) -> str:
    """``((decoding, seeds), ...)`` as one argument, e.g. ``greedy:1,t0.3:5,t0.7:5``."""
    return ",".join(f"{d}:{int(n)}" for d, n in group)


def parse_decode_group(text: str) -> tuple[tuple[str, int], ...]:
    """The inverse of :func:`format_decode_group`; ValueError for a malformed one."""
    out = []
    for part in text.split(","):
        d, sep, n = part.partition(":")
        if not sep or not d or not n.isdigit() or int(n) < 1:
            raise ValueError(f"decode group {text!r}: {part!r} is not DECODING:SEEDS")
        out.append((d, int(n)))
    return tuple(out)
