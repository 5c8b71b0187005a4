"""The canonical item schema shared by every benchmark, and the benchmark constants.

One row per item; :data:`COLUMNS` (commented there) plus :data:`CROWS_COLUMNS` for
CrowS-Pairs. Benchmark-specific fields live in ``meta`` (see normalize.py).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import pandas as pd
import pyarrow as pa

from ..errors import SafetyReproError

KNOWN_BENCHMARKS: tuple[str, ...] = ("truthfulqa", "bbq", "toxigen", "crows_pairs", "xstest")

#: The eleven categories of the full BBQ release.
BBQ_ALL_CATEGORIES: tuple[str, ...] = (
    "Age", "Disability_status", "Gender_identity", "Nationality", "Physical_appearance",
    "Race_ethnicity", "Race_x_SES", "Race_x_gender", "Religion", "SES", "Sexual_orientation",
)
#: The six categories whose files exist in ../shared (PROVENANCE.md): the default selection,
#: for both sources, so that ``local`` and ``hub`` define the same subset.
BBQ_DEFAULT_CATEGORIES: tuple[str, ...] = (
    "Age", "Disability_status", "Nationality", "Physical_appearance", "Religion",
    "Sexual_orientation",
)

#: ToxiGen ids below this are the 940-row annotated test split; the rest are train.
TOXIGEN_TEST_SIZE = 940

#: Split the evaluated subset is drawn from / split the few-shot pool is drawn from.
EVAL_SPLIT = {"truthfulqa": "validation", "bbq": "test", "toxigen": "test",
              "crows_pairs": "test", "xstest": "test"}
FEWSHOT_SPLIT = {**EVAL_SPLIT, "toxigen": "train"}
FEWSHOT_SIZE = 5

#: How ``stratum`` is formed (levels separated by "/").
STRATA = {
    "truthfulqa": "'all' (uniform)",
    "bbq": "<category>/<context_condition>, e.g. 'Age/ambig'",
    "toxigen": "<label>: 'toxic' or 'benign'",
    "crows_pairs": "<bias_type>, e.g. 'race-color'",
    "xstest": "<label>/<type>, e.g. 'safe/homonyms', 'unsafe/contrast_homonyms'",
}

# item_id   stable: truthfulqa/<index>, bbq/<Category>/<example_id>, toxigen/<id>,
#           crows_pairs/<index>, xstest/<id>
# split     truthfulqa validation; toxigen test (ids 0-939) or train (ids >= 940); else test
# question  truthfulqa, bbq; context: bbq; text: the toxigen statement or xstest prompt (else null)
# choices   answer options (truthfulqa: shuffled MC1 choices; bbq: ans0..ans2), else []
# gold      index of the correct choice, or -1 when the item has no options
# label     toxigen toxic/benign; xstest safe/unsafe; else null
# meta      JSON object (string) with the benchmark-specific fields
# stratum   the stratum subsets are drawn by (:data:`STRATA`)
# CrowS-Pairs adds sent_more / sent_less (the more / less stereotypical sentence).
COLUMNS: tuple[str, ...] = ("item_id", "benchmark", "split", "question", "context", "text",
                            "choices", "gold", "label", "meta", "stratum")
CROWS_COLUMNS: tuple[str, ...] = ("sent_more", "sent_less")


class ItemsError(SafetyReproError):
    """Bad request about items: unknown benchmark or category, overlapping pools..."""


class UnknownCategoryError(ItemsError):
    """A BBQ category that does not exist (the message lists the available ones)."""


def check_benchmark(name: str) -> str:
    if name not in KNOWN_BENCHMARKS:
        raise ItemsError(f"unknown benchmark {name!r}; known benchmarks: "
                         f"{', '.join(KNOWN_BENCHMARKS)}")
    return name


def columns(benchmark: str) -> tuple[str, ...]:
    return COLUMNS + (CROWS_COLUMNS if benchmark == "crows_pairs" else ())


def arrow_schema(benchmark: str) -> pa.Schema:
    fields = [
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("benchmark", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("question", pa.string()),
        pa.field("context", pa.string()),
        pa.field("text", pa.string()),
        pa.field("choices", pa.list_(pa.string()), nullable=False),
        pa.field("gold", pa.int64(), nullable=False),
        pa.field("label", pa.string()),
        pa.field("meta", pa.string(), nullable=False),
        pa.field("stratum", pa.string(), nullable=False),
    ]
    if benchmark == "crows_pairs":
        fields += [pa.field(c, pa.string(), nullable=False) for c in CROWS_COLUMNS]
    return pa.schema(fields)


def dump_meta(meta: Mapping[str, Any]) -> str:
    return json.dumps(meta, sort_keys=True, ensure_ascii=False)


def item_meta(row) -> dict:
    """The benchmark-specific metadata of an item row (a Series, dict or namedtuple)."""
    raw = row["meta"] if not hasattr(row, "_fields") else row.meta
    return json.loads(raw)


def make_frame(records: list[dict], benchmark: str) -> pd.DataFrame:
    """Canonical DataFrame (columns in schema order) from normalised item records."""
    cols = columns(benchmark)
    df = pd.DataFrame.from_records(records, columns=list(cols))
    df["gold"] = df["gold"].astype("int64")
    return df


def to_arrow(df: pd.DataFrame, benchmark: str) -> pa.Table:
    """The items as an Arrow table with the exact canonical schema (null-only text columns
    keep type string; choices stay list<string>)."""
    cols = list(columns(benchmark))
    data = {c: df[c].tolist() for c in cols}
    data["choices"] = [list(c) for c in data["choices"]]
    for c in ("question", "context", "text", "label"):
        data[c] = [None if (v is None or (isinstance(v, float) and v != v)) else v
                   for v in data[c]]
    return pa.Table.from_pydict(data, schema=arrow_schema(benchmark))
