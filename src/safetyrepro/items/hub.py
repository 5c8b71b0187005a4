"""``data.source: hub``: the benchmarks from their public Hugging Face hub datasets,
normalised to the canonical schema by the same row functions as the local files.

Only :func:`fetch` touches the network; the ``normalize_*_hub`` functions are pure, so they
are tested on hub-format files written locally. Where a hub dataset differs from the local
file, the comment above its normaliser says how. Each split read is recorded as a source
``{"path": "hub:<id>[/<config>]:<split>", "sha256": <hash of its rows>}``, so the subset hash
pins the content used."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..errors import DataError
from ..hashing import canonical_hash
from .loaders import resolve_bbq_categories
from .normalize import bbq_item, crows_item, toxigen_item, truthfulqa_item, xstest_item
from .schema import BBQ_ALL_CATEGORIES, TOXIGEN_TEST_SIZE

TOXIGEN_HUB_THRESHOLD = 5.5


@dataclass(frozen=True)
class HubSplit:
    repo: str
    config: str | None
    split: str

    @property
    def where(self) -> str:
        return f"hub:{self.repo}" + (f"/{self.config}" if self.config else "") + f":{self.split}"


def hub_splits(name: str, categories: Sequence[str] | None = None) -> list[HubSplit]:
    """The hub datasets/splits a benchmark is read from."""
    if name == "truthfulqa":
        return [HubSplit("truthful_qa", "multiple_choice", "validation")]
    if name == "bbq":
        cats = resolve_bbq_categories(categories, BBQ_ALL_CATEGORIES)
        return [HubSplit("heegyu/bbq", c, "test") for c in cats]
    if name == "toxigen":
        return [HubSplit("toxigen/toxigen-data", "annotated", "test"),
                HubSplit("toxigen/toxigen-data", "annotated", "train")]
    if name == "crows_pairs":
        return [HubSplit("nyu-mll/crows_pairs", None, "test")]
    if name == "xstest":
        return [HubSplit("walledai/XSTest", None, "test")]
    raise AssertionError(name)


def fetch(spec: HubSplit):
    """Load one split from the hub (the only function here that needs the network)."""
    import datasets  # deferred: datasets (heavy), only a hub download needs it

    try:
        return datasets.load_dataset(spec.repo, spec.config, split=spec.split)
    except Exception as exc:  # connection, gated dataset, missing config, ...
        raise DataError(spec.where, f"could not load from the Hugging Face hub "
                                    f"({type(exc).__name__}: {exc}). The hub may be "
                                    f"unreachable or the dataset gated (log in with a token); "
                                    f"or use data.source: local with data.local_dir / "
                                    f"SAFETYREPRO_DATA") from exc


def hub_rows(ds: Any) -> list[dict]:
    """Rows of a hub dataset as dicts, ClassLabel integers decoded to their names."""
    rows = ds.to_list() if hasattr(ds, "to_list") else [dict(r) for r in ds]
    features = getattr(ds, "features", None) or {}
    for col, feat in features.items():
        if type(feat).__name__ == "ClassLabel":
            for r in rows:
                if isinstance(r.get(col), int) and r[col] >= 0:
                    r[col] = feat.int2str(r[col])
    return rows


def _need(rows: list[dict], cols: Sequence[str], where: str) -> None:
    if rows:
        missing = [c for c in cols if c not in rows[0]]
        if missing:
            raise DataError(where, f"missing column(s) {', '.join(missing)}; columns are "
                                   f"{sorted(rows[0])}")


# ------------------------------------------------------------------- normalisers (pure)
# truthful_qa/multiple_choice/validation = the local v0/mc_task.json (mc1_targets as
# {choices, labels}); ids are row positions, as locally.
def normalize_truthfulqa_hub(ds: Any, *, items_seed: int,
                             where: str = "hub:truthful_qa/multiple_choice:validation"
                             ) -> list[dict]:
    rows = hub_rows(ds)
    _need(rows, ("question", "mc1_targets"), where)
    out = []
    for n, r in enumerate(rows, start=1):
        mc1, mc2 = r["mc1_targets"] or {}, r.get("mc2_targets") or {}
        if not isinstance(mc1, dict) or "choices" not in mc1 or "labels" not in mc1:
            raise DataError(where, "mc1_targets must be {choices, labels}", row=n)
        out.append(truthfulqa_item(n - 1, r["question"], mc1["choices"], mc1["labels"],
                                   items_seed=items_seed, where=where, row=n,
                                   mc2_choices=mc2.get("choices"), mc2_labels=mc2.get("labels")))
    return out


# heegyu/bbq, one config per category, split test: the same fields as the jsonl files.
def normalize_bbq_hub(ds: Any, *, category: str, where: str | None = None) -> list[dict]:
    where = where or f"hub:heegyu/bbq/{category}:test"
    return [bbq_item(r, where=where, row=n, category=category)
            for n, r in enumerate(hub_rows(ds), start=1)]


# toxigen/toxigen-data/annotated: all 940 test rows and the train rows (the few-shot pool),
# toxic iff toxicity_ai + toxicity_human > 5.5 (lm-eval's rule). The local SafeNLP file keeps
# 727 test rows and labels by annotator agreement (it has no toxicity_ai), so the two
# labellings differ on some items.
def normalize_toxigen_hub(ds: Any, *, split: str,
                          where: str | None = None) -> list[dict]:
    """``split`` 'test' gives ids 0..939, 'train' ids 940.. (the SafeNLP id convention)."""
    where = where or f"hub:toxigen/toxigen-data/annotated:{split}"
    if split not in ("test", "train"):
        raise ValueError(f"split must be test or train, not {split!r}")
    offset = 0 if split == "test" else TOXIGEN_TEST_SIZE
    rows = hub_rows(ds)
    _need(rows, ("text", "target_group", "toxicity_ai", "toxicity_human"), where)
    out = []
    for n, r in enumerate(rows, start=1):
        try:
            total = float(r["toxicity_ai"]) + float(r["toxicity_human"])
        except (TypeError, ValueError):
            raise DataError(where, f"toxicity_ai / toxicity_human must be numbers, got "
                                   f"{r['toxicity_ai']!r} / {r['toxicity_human']!r}",
                            row=n) from None
        out.append(toxigen_item(offset + n - 1, r["text"], total > TOXIGEN_HUB_THRESHOLD,
                                [r["target_group"]] if r["target_group"] is not None else [],
                                r["toxicity_human"], source_label=f"ai+human={total:g}",
                                label_rule=f"toxicity_ai + toxicity_human > "
                                           f"{TOXIGEN_HUB_THRESHOLD}",
                                where=where, row=n,
                                extra_meta={"toxicity_ai": float(r["toxicity_ai"])}))
    return out


# nyu-mll/crows_pairs/test: ClassLabel columns are decoded to their names.
def normalize_crows_pairs_hub(ds: Any, *, where: str = "hub:nyu-mll/crows_pairs:test"
                              ) -> list[dict]:
    rows = hub_rows(ds)
    _need(rows, ("sent_more", "sent_less", "stereo_antistereo", "bias_type"), where)
    return [crows_item(r.get("id", n - 1), r["sent_more"], r["sent_less"],
                       r["stereo_antistereo"], r["bias_type"], where=where, row=n)
            for n, r in enumerate(rows, start=1)]


# walledai/XSTest/test has no id column: ids are 1-based row positions, as in the local
# xstest_prompts.csv.
def normalize_xstest_hub(ds: Any, *, where: str = "hub:walledai/XSTest:test") -> list[dict]:
    rows = hub_rows(ds)
    _need(rows, ("prompt", "type", "label"), where)
    return [xstest_item(r.get("id", n), r["prompt"], r["type"], r["label"], r.get("focus"),
                        r.get("note"), where=where, row=n)
            for n, r in enumerate(rows, start=1)]


# ------------------------------------------------------------------------------ loader
def load_hub(name: str, *, categories: Sequence[str] | None = None, items_seed: int,
             fetch: Callable[[HubSplit], Any] = fetch) -> tuple[list[dict], list[dict]]:
    """All items of a benchmark from the hub: ``(records, sources)`` like loaders.load_local.
    ``fetch`` loads one HubSplit (default: from the hub)."""
    records: list[dict] = []
    sources: list[dict] = []
    for spec in hub_splits(name, categories):
        ds = hub_rows(fetch(spec))  # decoded once; the normalisers accept row lists too
        sources.append({"path": spec.where, "sha256": canonical_hash(ds)})
        if name == "truthfulqa":
            records += normalize_truthfulqa_hub(ds, items_seed=items_seed, where=spec.where)
        elif name == "bbq":
            records += normalize_bbq_hub(ds, category=spec.config, where=spec.where)
        elif name == "toxigen":
            records += normalize_toxigen_hub(ds, split=spec.split, where=spec.where)
        elif name == "crows_pairs":
            records += normalize_crows_pairs_hub(ds, where=spec.where)
        else:
            records += normalize_xstest_hub(ds, where=spec.where)
    dupes = [i for i, k in Counter(r["item_id"] for r in records).items() if k > 1]
    if dupes:
        raise DataError(f"hub:{name}", f"duplicate item(s) {', '.join(dupes[:5])}")
    return records, sources
