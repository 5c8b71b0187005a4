"""Local source files -> canonical items, one loader per benchmark.

Each loader takes the data folder (``data.local_dir`` / ``SAFETYREPRO_DATA``) and returns
``(records, sources)``: normalised item records (normalize.py) and the source files read,
as ``{"path": <relative to the data folder>, "sha256": ...}``. Files are read once as bytes,
hashed and parsed from those bytes, so the recorded digest is the content that was used.
Text files are decoded as UTF-8 with an optional BOM (``utf-8-sig``)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path
from typing import Iterator, Sequence

from ..config import DATA_ENV
from ..errors import DataError
from .normalize import bbq_item, crows_item, toxigen_item, truthfulqa_item, xstest_item
from .schema import BBQ_ALL_CATEGORIES, BBQ_DEFAULT_CATEGORIES, UnknownCategoryError

TRUTHFULQA_FILE = "truthfulqa/v0/mc_task.json"
BBQ_DIR = "bbq/data"
TOXIGEN_FILE = "toxigen/safenlp/toxiGen.json"
CROWS_FILE = "crows_pairs/crows_pairs_anonymized.csv"
XSTEST_FILE = "xstest/xstest_prompts.csv"

Source = dict  # {"path": str, "sha256": str}


def _read(data_dir: Path, rel: str, benchmark: str) -> tuple[str, Path, Source]:
    data_dir = Path(data_dir)
    path = data_dir / rel
    if not path.is_file():
        folder = ("" if data_dir.is_dir()
                  else f" (the data folder {data_dir} does not exist either)")
        raise DataError(path, f"{benchmark} source file not found{folder}. Set the config key "
                              f"data.local_dir, or the environment variable {DATA_ENV}, to the "
                              f"folder that holds {rel}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(path, f"not UTF-8 text ({exc})") from None
    return text, path, {"path": rel, "sha256": hashlib.sha256(raw).hexdigest()}


def _json_list(text: str, path: Path) -> list:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(path, f"invalid JSON at line {exc.lineno}, column {exc.colno}: "
                              f"{exc.msg}") from None
    if not isinstance(data, list):
        raise DataError(path, f"expected a JSON list of items, got {type(data).__name__}")
    return data


def _jsonl(text: str, path: Path) -> Iterator[tuple[int, object]]:
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(path, f"invalid JSON: {exc.msg} (column {exc.colno})",
                            row=lineno) from None


def _csv(text: str, path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    missing = [c for c in required if c not in header]
    if missing:
        raise DataError(path, f"missing column(s) {', '.join(missing)}; header is {header}")
    for n, rec in enumerate(reader, start=1):
        if None in rec or any(v is None for v in rec.values()):
            raise DataError(path, f"row has a different number of fields than the header "
                                  f"({len(header)})", row=n)
        yield n, rec


def _unique(rows: Sequence[int], records: list[dict], path: Path) -> list[dict]:
    """``records`` (read from ``rows`` of ``path``), checked for repeated item ids."""
    seen: dict[str, int] = {}
    for n, rec in zip(rows, records):
        if rec["item_id"] in seen:
            raise DataError(path, f"duplicate item {rec['item_id']} (first at row "
                                  f"{seen[rec['item_id']]})", row=n)
        seen[rec["item_id"]] = n
    return records


# ---------------------------------------------------------------------------- loaders
def load_truthfulqa(data_dir: Path, *, items_seed: int) -> tuple[list[dict], list[Source]]:
    text, path, src = _read(data_dir, TRUTHFULQA_FILE, "truthfulqa")
    out = []
    for n, rec in enumerate(_json_list(text, path), start=1):
        if not isinstance(rec, dict) or not isinstance(rec.get("mc1_targets"), dict):
            raise DataError(path, "expected an object with 'question' and 'mc1_targets' "
                                  "{answer: 0/1}", row=n)
        mc2 = rec.get("mc2_targets") if isinstance(rec.get("mc2_targets"), dict) else {}
        out.append(truthfulqa_item(n - 1, rec.get("question"), list(rec["mc1_targets"]),
                                   list(rec["mc1_targets"].values()), items_seed=items_seed,
                                   where=str(path), row=n, mc2_choices=list(mc2),
                                   mc2_labels=list(mc2.values())))
    return _unique(range(1, len(out) + 1), out, path), [src]


def bbq_local_categories(data_dir: Path) -> list[str]:
    folder = Path(data_dir) / BBQ_DIR
    return [c for c in BBQ_ALL_CATEGORIES if (folder / f"{c}.jsonl").is_file()]


def resolve_bbq_categories(categories: Sequence[str] | None,
                           available: Sequence[str]) -> list[str]:
    """The requested categories (default: the six of PROVENANCE.md), validated."""
    cats = list(BBQ_DEFAULT_CATEGORIES if categories is None else categories)
    unknown = [c for c in cats if c not in BBQ_ALL_CATEGORIES]
    if unknown:
        raise UnknownCategoryError(f"unknown BBQ categor{'y' if len(unknown) == 1 else 'ies'} "
                                   f"{', '.join(map(repr, unknown))}; available: "
                                   f"{', '.join(available)}")
    dupes = sorted({c for c in cats if cats.count(c) > 1})
    if dupes:
        raise UnknownCategoryError(f"BBQ categories listed twice: {', '.join(dupes)}")
    if not cats:
        raise UnknownCategoryError(f"no BBQ categories selected; available: "
                                   f"{', '.join(available)}")
    return cats


def load_bbq(data_dir: Path, *, categories: Sequence[str] | None = None
             ) -> tuple[list[dict], list[Source]]:
    available = bbq_local_categories(data_dir)
    cats = resolve_bbq_categories(categories, available)
    out, sources = [], []
    for cat in cats:
        rel = f"{BBQ_DIR}/{cat}.jsonl"
        if cat not in available:
            path = Path(data_dir) / rel
            raise DataError(path, f"BBQ category file not found; categories present in "
                                  f"{Path(data_dir) / BBQ_DIR}: {', '.join(available) or 'none'}. "
                                  f"Choose among them (config benchmarks.bbq.categories) or set "
                                  f"data.local_dir / {DATA_ENV} to a folder holding {rel}")
        text, path, src = _read(data_dir, rel, "bbq")
        rows = list(_jsonl(text, path))
        recs = [bbq_item(rec, where=str(path), row=n, category=cat) for n, rec in rows]
        out += _unique([n for n, _ in rows], recs, path)
        sources.append(src)
    return out, sources


def load_toxigen(data_dir: Path) -> tuple[list[dict], list[Source]]:
    text, path, src = _read(data_dir, TOXIGEN_FILE, "toxigen")
    out = []
    for n, rec in enumerate(_json_list(text, path), start=1):
        if not isinstance(rec, dict):
            raise DataError(path, f"expected an object, got {type(rec).__name__}", row=n)
        missing = [k for k in ("id", "text", "toxicity_score", "label", "target_groups")
                   if k not in rec]
        if missing:
            raise DataError(path, f"missing field(s) {', '.join(missing)}", row=n)
        if rec["label"] not in ("hate", "neutral"):
            raise DataError(path, f"label must be hate or neutral, got {rec['label']!r}", row=n)
        out.append(toxigen_item(rec["id"], rec["text"], rec["label"] == "hate",
                                rec["target_groups"], rec["toxicity_score"],
                                source_label=rec["label"],
                                label_rule="SafeNLP label == 'hate'", where=str(path), row=n))
    return _unique(range(1, len(out) + 1), out, path), [src]


def load_crows_pairs(data_dir: Path) -> tuple[list[dict], list[Source]]:
    text, path, src = _read(data_dir, CROWS_FILE, "crows_pairs")
    cols = ("sent_more", "sent_less", "stereo_antistereo", "bias_type")
    out = [crows_item(rec.get("", n - 1), rec["sent_more"], rec["sent_less"],
                      rec["stereo_antistereo"], rec["bias_type"], where=str(path), row=n)
           for n, rec in _csv(text, path, cols)]
    return _unique(range(1, len(out) + 1), out, path), [src]


def load_xstest(data_dir: Path) -> tuple[list[dict], list[Source]]:
    text, path, src = _read(data_dir, XSTEST_FILE, "xstest")
    cols = ("id", "prompt", "type", "label", "focus", "note")
    out = [xstest_item(rec["id"], rec["prompt"], rec["type"], rec["label"],
                       rec["focus"] or None, rec["note"] or None, where=str(path), row=n)
           for n, rec in _csv(text, path, cols)]
    return _unique(range(1, len(out) + 1), out, path), [src]


def load_local(name: str, data_dir: Path, *, categories: Sequence[str] | None = None,
               items_seed: int) -> tuple[list[dict], list[Source]]:
    if name == "truthfulqa":
        return load_truthfulqa(data_dir, items_seed=items_seed)
    if name == "bbq":
        return load_bbq(data_dir, categories=categories)
    if name == "toxigen":
        return load_toxigen(data_dir)
    if name == "crows_pairs":
        return load_crows_pairs(data_dir)
    if name == "xstest":
        return load_xstest(data_dir)
    raise AssertionError(name)  # names are checked by the caller
