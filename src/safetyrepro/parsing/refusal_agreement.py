"""Agreement of the XSTest refusal classifier with human refusal/compliance labels.

The dev set (``devdata/refusal_wildguardtest.jsonl.gz``, provenance in ``devdata/PROVENANCE.md``)
holds WildGuardTest responses with human labels, independent of XSTest's own held-out
completions; each record's ``split`` is ``tune`` (rules may be adjusted on it) or ``heldout``.
Compared: complied (``comply``) vs did not (``refuse``/``partial``, as the task counts them);
``unclear`` and empty responses are abstentions. Commands (``python -m
safetyrepro.parsing.refusal_agreement``): no argument = agreement per split, ``build
SOURCE.parquet`` = rebuild the dev set, ``ceiling`` = the learned reference on ``tune``.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import platform
import re
import sys
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

from ..errors import DataError
from ..hashing import sha256_file
from ..tasks import load_task
from . import refusal_spec
from .refusal import classify_refusal

DEVDATA = Path(__file__).resolve().parent / "devdata"
DEVSET = DEVDATA / "refusal_wildguardtest.jsonl.gz"

# The source table (WildGuardTest, allenai/wildguardmix config ``wildguardtest``) as copied at
# github.com/sharzilnfz/llmSafetyClassification, commit ff7f31b8d46fe09fbb5f82a4b805864048e0c2ef,
# path data/wildguardtest.parquet.
SOURCE_SHA256 = "315d1fda645e303a5a3d3faef67d51d528ab590e2a96bc0d8f97d570b3d800a0"
SAMPLE_SIZE = 1000
SAMPLE_SEED = 13
SPLITS = ("tune", "heldout")
GOLD_MAP = {"compliance": "comply", "refusal": "refuse"}  # WildGuard label -> binary gold
COMPLY, NOT_COMPLY = "comply", "refuse"
TRUNCATIONS = (15, 100)  # words: about the 20 and 128 new tokens XSTest cells generate
_WORD_AND_SPACE = re.compile(r"\S+\s*")
_FIELDS = {"id": str, "split": str, "gold": str, "agreement": int, "response": str,
           "prompt": str, "prompt_harm": str, "adversarial": bool}


@dataclass(frozen=True)
class DevRecord:
    id: str
    split: str           # "tune" or "heldout"
    gold: str            # "comply" or "refuse"
    agreement: int       # annotators (of 3) who gave the majority label: 2 or 3
    response: str
    prompt: str
    prompt_harm: str     # "harmful" / "unharmful" / "" (no majority)
    adversarial: bool


# ----------------------------------------------------------------------------- building
def build_devset(source: str | Path, out: str | Path = DEVSET, *, n: int = SAMPLE_SIZE,
                 seed: int = SAMPLE_SEED, check_sha: bool = True,
                 rest_to_tune: bool = True) -> list[DevRecord]:
    """Sample the dev set from WildGuardTest's parquet: the rows with a human refusal label in
    a seeded random order (numpy ``default_rng(seed).permutation``); of the first ``n``, the
    first half ``tune`` and the second ``heldout``; with ``rest_to_tune`` every labelled row
    after the first ``n`` is added to ``tune`` too (written after the first ``n``, so the
    ``heldout`` half does not depend on it). Written as gzip JSONL with a zero timestamp, so
    the same source and arguments give the same bytes."""
    import numpy as np  # deferred: numpy/pandas (dev-set rebuild only)
    import pandas as pd  # deferred: numpy/pandas (dev-set rebuild only)

    source = Path(source)
    if check_sha:
        digest = sha256_file(source)
        if digest != SOURCE_SHA256:
            raise DataError(source, f"sha256 {digest} is not the recorded WildGuardTest copy's "
                                    f"{SOURCE_SHA256} (see devdata/PROVENANCE.md)")
    df = pd.read_parquet(source)
    for col in ("prompt", "response", "response_refusal_label", "response_refusal_agreement",
                "prompt_harm_label", "adversarial"):
        if col not in df.columns:
            raise DataError(source, f"missing column {col!r}")
    df = df.reset_index(drop=True)
    labelled = df.index[df["response_refusal_label"].isin(list(GOLD_MAP))].to_numpy()
    if len(labelled) < n:
        raise DataError(source, f"only {len(labelled)} labelled responses; asked for {n}")
    order = labelled[np.random.default_rng(seed).permutation(len(labelled))]
    chosen = order if rest_to_tune else order[:n]
    records = []
    for pos, row_idx in enumerate(chosen):
        row = df.loc[row_idx]
        harm = row["prompt_harm_label"]
        records.append(DevRecord(
            id=f"wgt-{int(row_idx)}", split=SPLITS[1] if n // 2 <= pos < n else SPLITS[0],
            gold=GOLD_MAP[row["response_refusal_label"]],
            agreement=int(row["response_refusal_agreement"]),
            response=str(row["response"]), prompt=str(row["prompt"]),
            prompt_harm=str(harm) if isinstance(harm, str) else "",
            adversarial=bool(row["adversarial"])))
    write_devset(records, out)
    return records


def write_devset(records: Iterable[DevRecord], out: str | Path) -> None:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz:
        for r in records:
            gz.write((json.dumps(r.__dict__, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8"))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_bytes(buf.getvalue())


def load_devset(path: str | Path = DEVSET) -> list[DevRecord]:
    """Read and validate the dev set; a bad record raises DataError naming the file, line and
    field."""
    path = Path(path)
    records, seen = [], set()
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(path, f"line {lineno}: not JSON ({e})") from None
            for field, typ in _FIELDS.items():
                if not isinstance(obj.get(field), typ):
                    raise DataError(path, f"line {lineno}: field {field!r} is "
                                          f"{obj.get(field)!r}, expected {typ.__name__}")
            if obj["split"] not in SPLITS:
                raise DataError(path, f"line {lineno}: field 'split' is {obj['split']!r}, expected one of {SPLITS}")
            if obj["gold"] not in (COMPLY, NOT_COMPLY):
                raise DataError(path, f"line {lineno}: field 'gold' is {obj['gold']!r}, expected comply/refuse")
            if obj["id"] in seen:
                raise DataError(path, f"line {lineno}: duplicate id {obj['id']!r}")
            seen.add(obj["id"])
            records.append(DevRecord(**{k: obj[k] for k in _FIELDS}))
    if not records:
        raise DataError(path, "no records")
    return records


# ----------------------------------------------------------------------------- measuring
def binary(label: str | None, partial: str = NOT_COMPLY) -> str | None:
    """The classifier's label as the binary decision: comply / refuse, with ``partial`` read
    as ``partial`` says (by default as not complying, the XSTest task's convention); None for
    an abstention (``unclear``) or an unparseable response."""
    if label == "comply":
        return COMPLY
    if label == "refuse":
        return NOT_COMPLY
    if label == "partial":
        return partial
    return None


def agreement(records: Iterable[DevRecord], classify: Callable[[str], str | None]) -> dict:
    """Agreement counts of ``classify`` (text -> comply/refuse/partial/unclear/None) with the
    human labels::

        {"n", "n_decided", "n_abstained", "n_agree",
         "abstention_rate"             n_abstained / n,
         "agreement_decided"           n_agree / n_decided (comply vs refuse, where decided;
                                       partial counts as refuse, as the task scores it),
         "agreement_abstain_as_error"  n_agree / n,
         "n_agree_partial_as_comply", "agreement_decided_partial_as_comply"
                                       the same with partial read as comply (the source's
                                       annotators label refuse-then-comply as compliance),
         "confusion": {gold: {classifier label or "unparseable": count}},
         "by_agreement": {"3": {...}, "2": {...}}   the same three rates by annotator agreement}
    """
    recs = list(records)
    rows = [(r, classify(r.response)) for r in recs]
    out = _rates(rows)
    confusion: dict[str, Counter] = {COMPLY: Counter(), NOT_COMPLY: Counter()}
    for r, label in rows:
        confusion[r.gold][label if label is not None else "unparseable"] += 1
    out["confusion"] = {g: dict(sorted(c.items())) for g, c in confusion.items()}
    out["by_agreement"] = {str(k): _rates([(r, lab) for r, lab in rows if r.agreement == k])
                           for k in sorted({r.agreement for r in recs}, reverse=True)}
    return out


def _rates(rows: list) -> dict:
    n = len(rows)
    decided = [(r, lab) for r, lab in rows if binary(lab) is not None]
    agree = sum(r.gold == binary(lab) for r, lab in decided)
    agree_pc = sum(r.gold == binary(lab, partial=COMPLY) for r, lab in decided)
    nan = float("nan")
    return {"n": n, "n_decided": len(decided), "n_abstained": n - len(decided), "n_agree": agree,
            "abstention_rate": (n - len(decided)) / n if n else nan,
            "agreement_decided": agree / len(decided) if decided else nan,
            "agreement_abstain_as_error": agree / n if n else nan,
            "n_agree_partial_as_comply": agree_pc,
            "agreement_decided_partial_as_comply": agree_pc / len(decided) if decided else nan}


def first_words(text: str, n: int) -> str:
    """The first ``n`` whitespace-separated words of ``text`` (with their spacing)."""
    return "".join(_WORD_AND_SPACE.findall(text)[:n])


def _rates_only(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in ("confusion", "by_agreement")}


def xstest_classifier() -> Callable[[str], str | None]:
    """The refusal classifier exactly as the XSTest task configures it (``tasks/xstest.yaml``),
    returning its raw outcome (``unclear`` included, not folded into None)."""
    spec = refusal_spec(load_task("xstest").content["parser"])
    return lambda text: classify_refusal(spec, text).label


def report(devset: str | Path = DEVSET) -> dict:
    """The JSON record: agreement per split and overall, the parser version it measured and
    the dev set's identity."""
    records = load_devset(devset)
    classify = xstest_classifier()
    return {
        "what": "XSTest refusal classifier vs human refusal/compliance labels (WildGuardTest sample)",
        "devset": str(Path(devset).name), "devset_sha256": sha256_file(devset),
        "parser_version": load_task("xstest").parser_version,
        "binary_decision": "comply vs not comply (refuse or partial); unclear and unparseable abstain",
        "splits": {s: agreement([r for r in records if r.split == s], classify) for s in SPLITS},
        "all": agreement(records, classify),
        # the pipeline classifies generations of at most max_new_tokens (20 or 128 tokens for
        # XSTest), so the same measured on each response's first words (the human label still
        # judges the whole response)
        "first_words": {str(n): {s: _rates_only(agreement(
            [r for r in records if r.split == s], lambda t, n=n: classify(first_words(t, n))))
            for s in SPLITS} for n in TRUNCATIONS},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
    }


CEILING_C = (1.0, 4.0, 16.0)
CEILING_FOLDS = 5
CEILING_SEED = 0


def learned_ceiling(records: Iterable[DevRecord], *, c_values: Iterable[float] = CEILING_C,
                    folds: int = CEILING_FOLDS, seed: int = CEILING_SEED) -> dict:
    """How far a classifier fitted to the annotators' own binary labels gets on ``records``: an
    L2 logistic regression over tf-idf word and character n-grams of the response (and, as
    ``learned_cv_with_prompt``, of the prompt too), by stratified ``folds``-fold
    cross-validation (shuffled with ``seed``) for every C in ``c_values``, none picked. A
    reference, not part of the classifier: it learns WildGuard's scheme (refuse-then-comply is
    compliance), which shows how much of the gap to a target is the labels rather than the
    rules. Returns the rule classifier's agreement on the same records beside it."""
    import numpy as np  # deferred: numpy (learned reference only)
    from sklearn.compose import ColumnTransformer  # deferred: sklearn (learned reference only)
    from sklearn.feature_extraction.text import TfidfVectorizer  # deferred: sklearn (learned reference only)
    from sklearn.linear_model import LogisticRegression  # deferred: sklearn (learned reference only)
    from sklearn.model_selection import StratifiedKFold, cross_val_predict  # deferred: sklearn (learned reference only)
    from sklearn.pipeline import make_pipeline  # deferred: sklearn (learned reference only)

    recs = list(records)
    table = np.array([[r.response, r.prompt] for r in recs], dtype=object)
    gold = np.array([r.gold == COMPLY for r in recs])
    cv = StratifiedKFold(folds, shuffle=True, random_state=seed)

    def words() -> TfidfVectorizer:  # the same word features for the response and the prompt
        return TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)

    def features(with_prompt: bool) -> ColumnTransformer:
        parts = [("response_words", words(), 0),
                 ("response_chars", TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5),
                                                    min_df=3, sublinear_tf=True), 0)]
        if with_prompt:
            parts.append(("prompt_words", words(), 1))
        return ColumnTransformer(parts)

    def cross_validated(with_prompt: bool) -> dict:
        by_c = {}
        for c in c_values:
            model = make_pipeline(features(with_prompt),
                                  LogisticRegression(C=float(c), max_iter=3000))
            pred = cross_val_predict(model, table, gold, cv=cv)
            by_c[f"{float(c):g}"] = {"agreement": float((pred == gold).mean()),
                                     "n_agree": int((pred == gold).sum())}
        return by_c

    rules = _rates_only(agreement(recs, xstest_classifier()))
    return {"n": len(recs), "folds": folds, "seed": seed,
            "model": "tf-idf word 1-2-grams + char_wb 3-5-grams, L2 logistic regression",
            "learned_cv": cross_validated(False),
            "model_with_prompt": "the same + tf-idf word 1-2-grams of the prompt",
            "learned_cv_with_prompt": cross_validated(True), "rules": rules}


def _write_json(rec: dict, out: str | None) -> str:
    """``rec`` as indented, key-sorted JSON; written to ``out`` (folders created) when given."""
    text = json.dumps(rec, indent=2, sort_keys=True)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n", encoding="utf-8")
    return text


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "build":
        ap = argparse.ArgumentParser(prog="python -m safetyrepro.parsing.refusal_agreement build")
        ap.add_argument("source", help="WildGuardTest parquet (sha256 checked)")
        ap.add_argument("--out", default=str(DEVSET))
        args = ap.parse_args(argv[1:])
        recs = build_devset(args.source, args.out)
        print(f"wrote {len(recs)} records to {args.out}")
        return 0
    if argv and argv[0] == "ceiling":
        ap = argparse.ArgumentParser(prog="python -m safetyrepro.parsing.refusal_agreement ceiling")
        ap.add_argument("--devset", default=str(DEVSET))
        ap.add_argument("--out", help="write the JSON record here")
        args = ap.parse_args(argv[1:])
        tune = [r for r in load_devset(args.devset) if r.split == "tune"]  # never the held-out part
        rec = {"what": "learned reference on the tune part (5-fold CV); not the classifier",
               "devset_sha256": sha256_file(args.devset), "split": "tune", **learned_ceiling(tune),
               "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        print(_write_json(rec, args.out))
        return 0
    ap = argparse.ArgumentParser(prog="python -m safetyrepro.parsing.refusal_agreement")
    ap.add_argument("--devset", default=str(DEVSET))
    ap.add_argument("--out", help="write the JSON record here")
    args = ap.parse_args(argv)
    rec = report(args.devset)
    _write_json(rec, args.out)
    for name, r in list(rec["splits"].items()) + [("all", rec["all"])]:
        print(f"{name:8s} n={r['n']:4d}  agreement (decided) {r['agreement_decided']:.3f}  "
              f"abstained {r['abstention_rate']:.3f}  agreement (abstain = error) "
              f"{r['agreement_abstain_as_error']:.3f}  partial as comply "
              f"{r['agreement_decided_partial_as_comply']:.3f}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
