"""The resolved cell: what one cell job hands its model's worker, as data.

The cell rule passes its wildcards, its declared inputs and output and what the plan
resolved (the decode group, the expected fingerprint) to the job's client
(:mod:`.cell_client`), which builds one :class:`CellRequest` and sends it to the worker;
:func:`.cells.run_cell` computes exactly that cell and opens only the files it names. This
module imports only the standard library: the client starts once per cell job."""

from __future__ import annotations

from collections import namedtuple

# The request's fields in order; only ``fingerprint`` has a default (None). A named tuple, not
# a dataclass: ``dataclasses`` (with ``inspect``) was the largest import of a cell job's client,
# about 10 of its 45 ms (benchmarks/RESULTS.md section 22).
FIELDS = ("model", "variant", "quantization", "benchmark", "config_id", "seed", "decode_group",
          "config_path", "rules", "items", "fewshot", "model_marker", "out", "fingerprint")


class CellRequest(namedtuple("CellRequest", FIELDS, defaults=(None,))):
    """One (model, benchmark, config, seed) cell of a variant, resolved (immutable).

    ``config_id``: the envelope point (template-decoding-shots-scoring), looked up in the rules
    file ``rules``; ``seed``: an int; ``decode_group``: the ``((decoding, seeds), ...)`` it is
    decoded with (:meth:`.plan.Plan.decode_group`); ``config_path``: the run config YAML (model
    source, generation and runtime settings); ``items`` / ``fewshot`` / ``model_marker``: the
    item subset, the few-shot pool and the prepared-model marker; ``out``: the shard it writes;
    ``fingerprint``: the cell fingerprint the workflow planned without the chat-template hash
    (None: not checked). Every other field is a string."""
    __slots__ = ()

    def replace(self, **changes) -> "CellRequest":
        """A copy with ``changes`` (field name -> value)."""
        return self._replace(**changes)

    @property
    def id(self) -> str:
        return (f"{self.model}/{self.benchmark}/{self.config_id}/s{self.seed} "
                f"({self.variant}, {self.quantization})")

    def as_message(self) -> dict:
        """The request as a JSON object (what the client sends)."""
        d = self._asdict()
        d["decode_group"] = [list(g) for g in self.decode_group]
        return d

    @classmethod
    def from_message(cls, message: dict) -> "CellRequest":
        """The request a client sent (:meth:`as_message`); ValueError for a malformed one."""
        if not isinstance(message, dict):
            raise ValueError(f"a cell request is a JSON object, got {type(message).__name__}")
        names = set(FIELDS)
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
