"""Next-token choice: greedy argmax or seeded inverse-CDF sampling, one generator per sequence.

Greedy when ``temperature == 0`` (argmax; ties -> lowest token id, as ``torch.argmax`` and
transformers' greedy search). Otherwise softmax(logits / temperature), restricted to the
nucleus of mass ``top_p`` (smallest set of most likely tokens whose mass reaches top_p), and
sampled by inverse CDF with one uniform draw per step from a per-sequence ``torch.Generator``
seeded from ``(seed, prompt text)`` (:func:`item_seed`), so a sampled sequence's output does
not depend on batch size, batch composition or position in the call.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from ..errors import CellError


def item_seed(seed: int, prompt: str) -> int:
    """63-bit seed of one item's sampling generator, derived from the cell seed and the
    prompt text."""
    h = hashlib.sha256(f"{int(seed)}\0{prompt}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class Stream:
    """One decoding of every prompt of a call: its temperature (0: greedy), nucleus mass and
    seed. A call decodes several streams together (:func:`generate_streams`)."""
    temperature: float
    top_p: float = 1.0
    seed: int = 0


# ``exp(x)`` for x < -87.34 is a subnormal float32, which x86 CPUs compute through a slow
# microcode assist, and over a vocabulary most shifted logits fall that low. The row sampler
# clamps them here first: a clamped weight moves from < 1.2e-38 to 1.6e-38 next to the top
# token's 1, below the resolution of the float64 sums that locate the draw
# (``tests/inference/test_sampling.py`` checks the draws against the unclamped ones).
EXP_FLOOR = -87.0


class NonFiniteLogits(CellError):
    """A decode step produced NaN or Inf logits (a numerical failure of the model); ``prompt``
    is the prompt of the first sequence affected, so the cell can name its item."""

    def __init__(self, prompt: str | None, value: float):
        super().__init__(f"non-finite logit ({value}) while generating (numerical failure in "
                         "the model's logits)")
        self.prompt = prompt
        self.value = value


class _Sampler:
    """Per-row next-token choice. Row r is greedy (argmax) when its temperature is 0, else it
    draws from its own generator seeded by (seed_r, prompt_r). One temperature / top_p / seed
    for all rows, or per row (``temperatures``, ``top_ps``, ``seeds``)."""

    def __init__(self, temperature: float, top_p: float, seed: int, prompts: list[str],
                 seeds: list[int] | None = None, *, temperatures: list[float] | None = None,
                 top_ps: list[float] | None = None):
        n = len(prompts)
        temps = [float(t) for t in temperatures] if temperatures is not None else [float(temperature)] * n
        tops = [float(t) for t in top_ps] if top_ps is not None else [float(top_p)] * n
        for t in temps or [float(temperature)]:
            if t < 0:
                raise ValueError(f"temperature must be >= 0, got {t}")
        for t in tops or [float(top_p)]:
            if not 0 < t <= 1:
                raise ValueError(f"top_p must be in (0, 1], got {t}")
        row_seeds = seeds if seeds is not None else [seed] * n
        self.temps, self.top_ps = temps, tops
        self.gens = [torch.Generator().manual_seed(item_seed(s, p)) if t > 0 else None
                     for s, p, t in zip(row_seeds, prompts, temps)]
        self.greedy = all(t == 0 for t in temps)
        self.prompts = prompts

    @classmethod
    def for_streams(cls, streams: list[Stream], prompts: list[str]) -> "_Sampler":
        """Rows stream-major: row ``s * len(prompts) + j`` is stream s of prompt j."""
        n = len(prompts)
        return cls(0.0, 1.0, 0, list(prompts) * len(streams),
                   seeds=[st.seed for st in streams for _ in range(n)],
                   temperatures=[st.temperature for st in streams for _ in range(n)],
                   top_ps=[st.top_p for st in streams for _ in range(n)])

    def _uniforms(self, active: list[int]) -> torch.Tensor:
        """One float64 uniform per active row, each from the row's own generator."""
        return torch.stack([torch.rand((), generator=self.gens[r], dtype=torch.float64)
                            for r in active])

    def _check_elementwise(self, logits: torch.Tensor, active: list[int], rows: list[int]) -> None:
        """NonFiniteLogits naming the first sequence whose logits row holds a NaN or Inf, if
        any."""
        finite = torch.isfinite(logits).all(dim=-1).tolist()
        for j, row in enumerate(rows):
            if not finite[row]:
                r = active[j]
                raise NonFiniteLogits(self.prompts[r] if r < len(self.prompts) else None,
                                      float(logits[row][~torch.isfinite(logits[row])][0]))

    def __call__(self, logits: torch.Tensor, active: list[int],
                 rows: list[int] | None = None) -> torch.Tensor:
        """The next token of each sequence ``active[j]`` from its logits row: ``logits[j]``, or
        ``logits[rows[j]]`` where several sequences read one row (streams with equal histories,
        :func:`.decode.decode_stream_columns`); any float dtype. NonFiniteLogits if a row
        read holds NaN or Inf (argmax and the inverse CDF would turn it into some token,
        scored as a parse failure)."""
        if rows is None:
            rows = list(range(len(active)))
        # a NaN or Inf anywhere in a row makes its sum NaN or Inf: one reduction per step instead
        # of an elementwise mask over every logit (costly at a 262k vocabulary); a sum that
        # overflows on finite logits only sends the step to the exact check
        if not bool(torch.isfinite(logits.sum(dim=-1)).all()):
            self._check_elementwise(logits, active, rows)
        if self.greedy:
            return logits.argmax(dim=-1).index_select(0, torch.tensor(rows, device=logits.device))
        if logits.device.type == "cpu" and all(self.top_ps[r] == 1.0 for r in active):
            return self._draw_rows(logits, active, rows)
        if rows != list(range(logits.shape[0])):
            logits = logits.index_select(0, torch.tensor(rows, dtype=torch.long, device=logits.device))
        params = [(self.temps[r], self.top_ps[r]) for r in active]
        kinds = list(dict.fromkeys(params))
        if len(kinds) == 1:
            return self._draw_batch(logits, active, *kinds[0])
        out = torch.empty(len(active), dtype=torch.long, device=logits.device)
        for t, p in kinds:  # mixed streams: each kind of row on its own
            js = [j for j, k in enumerate(params) if k == (t, p)]
            idx = torch.tensor(js, dtype=torch.long, device=logits.device)
            out[idx] = self._draw_batch(logits.index_select(0, idx), [active[j] for j in js], t, p)
        return out

    def _draw_batch(self, logits: torch.Tensor, active: list[int], temperature: float | None = None,
                    top_p: float | None = None) -> torch.Tensor:
        """Softmax, nucleus and inverse CDF over the whole batch at once, all rows at one
        temperature / top_p (accelerators, and ``top_p < 1``)."""
        temperature = self.temps[active[0]] if temperature is None else temperature
        top_p = self.top_ps[active[0]] if top_p is None else top_p
        if temperature == 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        if top_p < 1.0:
            probs, order = probs.sort(dim=-1, descending=True)
            before = probs.cumsum(dim=-1) - probs  # mass strictly before each token
            probs = probs.masked_fill(before >= top_p, 0.0)
        else:
            order = None
        cdf = probs.cumsum(dim=-1)
        u = self._uniforms(active).to(device=cdf.device, dtype=cdf.dtype)
        u = u * cdf[:, -1]
        idx = torch.searchsorted(cdf, u.unsqueeze(1)).clamp_(max=cdf.shape[1] - 1)
        if order is not None:
            idx = order.gather(1, idx)
        return idx.squeeze(1)

    _BLOCK = 1024

    def _draw_rows(self, logits: torch.Tensor, active: list[int],
                   rows: list[int] | None = None) -> torch.Tensor:
        """The inverse-CDF draw (``top_p == 1``) one logits row at a time on the CPU, so a row's
        exponentials stay in cache instead of streaming ``[rows, V]`` tensors through memory.
        Float64 sums of blocks of 1,024 exponentials locate the block where u times the row
        total falls, then a cumulative sum within it the token. Sequences reading the same
        row at the same temperature share its exponentials and sums, each with its own u.
        Same draw as the batch version up to the rounding of the cumulative sums and the
        :data:`EXP_FLOOR` clamp."""
        n, v = logits.shape
        rows = list(range(len(active))) if rows is None else rows
        bs = self._BLOCK
        nb = -(-v // bs)
        if getattr(self, "_row", None) is None or self._row.numel() != nb * bs:
            self._row = torch.zeros(nb * bs, dtype=torch.float32)  # tail past v stays 0
        full, x = self._row, self._row[:v]
        blocks = full.view(nb, bs)
        sampled = [r for r in active if self.temps[r] > 0]
        u = dict(zip(sampled, self._uniforms(sampled).tolist())) if sampled else {}
        out = [0] * len(active)
        greedy: dict[int, int] = {}
        loaded, cs = None, None
        # sequences grouped by (row, temperature): each group's exponentials computed once
        for j in sorted(range(len(active)), key=lambda j: (rows[j], self.temps[active[j]])):
            r, row = active[j], rows[j]
            if self.temps[r] == 0:
                if row not in greedy:  # exact widening to float32 for the argmax
                    greedy[row] = int(logits[row].float().argmax())
                out[j] = greedy[row]
                continue
            if loaded != (row, self.temps[r]):
                x.copy_(logits[row])
                x.sub_(x.max()).mul_(1.0 / self.temps[r]).clamp_min_(EXP_FLOOR).exp_()
                cs = blocks.sum(1, dtype=torch.float64).cumsum_(0)
                loaded = (row, self.temps[r])
            target = u[r] * float(cs[-1])
            b = min(int(torch.searchsorted(cs, torch.tensor([target], dtype=torch.float64))), nb - 1)
            before = float(cs[b - 1]) if b else 0.0
            within = blocks[b].cumsum(0, dtype=torch.float64)
            i = int(torch.searchsorted(within, torch.tensor([target - before], dtype=torch.float64)))
            out[j] = min(b * bs + min(i, bs - 1), v - 1)
        return torch.tensor(out, dtype=torch.long)
