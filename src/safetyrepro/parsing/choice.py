"""Multiple-choice parser: a free-form response -> the letter of the chosen option.

Evidence is tried strongest first and the first step that decides wins: answer markers (the
last one), a leading letter, conclusion words, a letter opening the last line, a unique
answer-like mention (``Option B``, ``(C)``), then the options' own texts. A letter outside the
item's options after a marker is unparseable; a lower-case ``a`` followed by a word is the
English article, so a chain of thought cut off before its answer stays unparseable instead of
reading A. An echoed option list (several lines opening with different letters) is not an
answer. The full rules: docs/SCORING.md, "Multiple choice".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .text import marker_segments, norm_words, normalize

_OUT_OF_RANGE = object()
_LEAD = " \t\"'([{<"
_CLOSERS = ")]}>\"'"
_ENDERS = ".,:;!?-/|"
_VERDICT = re.compile(
    r"(?:is|would\s+be|seems)\s+(?:the\s+)?(?:correct|right|best|true|most\s+accurate|answer)\b",
    re.IGNORECASE,
)
# "option B", "choice (c)", "letter [a]", "answer C" on one line, or a bracketed "(C)" anywhere.
# Groups: 1 = a bracketed letter after a keyword, 2 = a bare letter after a keyword, 3 = "(X)".
_MENTION = re.compile(
    r"(?<![\w'])(?:option|choice|letter|answer)[ \t]*"
    r"(?:[(\[][ \t]*([A-Za-z])[ \t]*[)\]]|([A-Za-z]))(?![\w'])"
    r"|\(([A-Za-z])\)",
    re.IGNORECASE,
)

# A response that ends in "... to answer a" or "... and so a" was cut off after the article
# (max_new_tokens reached mid-sentence): the dangling "a" is dropped before parsing. After
# "is", "was", "be" or a keyword that names an option ("the answer is a", "option a") it stays
# a letter.
_DANGLING_ARTICLE = re.compile(r"(?<![\w'])([A-Za-z]+)[ \t]+a\Z")
_LETTER_BEFORE = frozenset({"is", "was", "be", "option", "choice", "letter"})


@dataclass(frozen=True)
class ChoiceSpec:
    markers: tuple[str, ...]
    conclusion_words: tuple[str, ...]
    letters: str


def _letter_at_start(seg: str, letters: str, options: list[str] | None):
    """The option letter a segment starts with, ``_OUT_OF_RANGE`` for a well-formed letter
    that is not one of ``letters``, or None when the segment does not start with a letter."""
    s = seg.lstrip(_LEAD)
    if not s or not s[0].isascii() or not s[0].isalpha():
        return None
    if len(s) > 1 and (s[1].isalnum() or s[1] in "'_"):
        return None  # a word, not a letter ("Paris", "I'd", "A1")
    if len(s) > 2 and s[1] in ".-/" and s[2].isalnum():
        return None  # an abbreviation or compound ("e.g.", "i.e.", "A-level", "B/C")
    letter = s[0].upper()
    rest = s[1:].lstrip(_CLOSERS)
    accepted = not rest or rest[0] in _ENDERS or rest[0] == "\n"
    if not accepted and rest[0].isspace():
        after = rest.strip()
        if not after or after[0] in _ENDERS or after[0] in "([":
            accepted = True
        elif _VERDICT.match(after):
            accepted = True
        elif options is not None and letter in letters:
            opt = norm_words(options[letters.index(letter)])
            accepted = bool(opt) and norm_words(after).startswith(opt)
    if not accepted:
        return None
    return letter if letter in letters else _OUT_OF_RANGE


def _drop_dangling_article(text: str) -> str:
    m = _DANGLING_ARTICLE.search(text)
    if m and m.group(1).lower() not in _LETTER_BEFORE:
        return text[: m.start()] + m.group(1)
    return text


def _mentioned_letters(text: str) -> set[str]:
    """Letters named in answer-like positions (step 5). A bare lower-case letter after the
    keyword counts only when punctuation, the end of its line or a verdict follows it, so the
    article in "to answer a question" or "the choice a reader makes" is not option A."""
    found = set()
    for m in _MENTION.finditer(text):
        bracketed, bare, alone = m.groups()
        if bare is not None and bare.islower():
            after = text[m.end(): m.end() + 80].lstrip(" \t")
            ends = not after or after[0] == "\n" or after[0] in _ENDERS or after[0] in _CLOSERS
            if not ends and not _VERDICT.match(after):
                continue
        found.add((bracketed or bare or alone).upper())
    return found


def _option_match(text: str, options: list[str] | None, letters: str, *, whole: bool) -> str | None:
    """The letter of the one option whose text the response is (``whole``) or contains."""
    if not options:
        return None
    resp = norm_words(text)
    if not resp:
        return None
    normed = [norm_words(o) for o in options]
    if whole:
        hits = [i for i, o in enumerate(normed) if o and o == resp]
    else:
        hits = [i for i, o in enumerate(normed) if o and o in resp]
        # an option that is part of a longer matched option ("Paris" vs "Paris, France")
        hits = [i for i in hits if not any(j != i and normed[i] in normed[j] for j in hits)]
    return letters[hits[0]] if len(hits) == 1 else None


def _strip_answer_prefix(text: str) -> str:
    return re.sub(r"^(?:final\s+)?answer\s*[:\-]\s*", "", text, flags=re.IGNORECASE)


def parse_choice(spec: ChoiceSpec, text: object, choices: list[str] | None) -> str | None:
    """The chosen letter, or None when the response does not determine one."""
    t = _drop_dangling_article(normalize(text))
    if not t:
        return None
    letters = spec.letters[: len(choices)] if choices else spec.letters
    options = list(choices) if choices else None

    # 1. explicit answer markers, last decisive one wins
    for seg in reversed(marker_segments(t, spec.markers)):
        got = _letter_at_start(seg, letters, options)
        if got is _OUT_OF_RANGE:
            return None
        if got:
            return got
        got = _option_match(seg.rstrip(" .!"), options, letters, whole=True)
        if got:
            return got

    # 2. the response itself starts with a letter -- unless several lines start with
    # different letters (an echo of the option list is not an answer)
    lines = [ln for ln in t.split("\n") if ln.strip()]
    line_letters = {_letter_at_start(ln, letters, options) for ln in lines} - {None, _OUT_OF_RANGE}
    listing = len(line_letters) > 1
    got = _letter_at_start(t, letters, options)
    if got and got is not _OUT_OF_RANGE and not listing:
        return got

    # 3. conclusion words ("Therefore, C")
    for seg in reversed(marker_segments(t, spec.conclusion_words)):
        got = _letter_at_start(seg, letters, options)
        if got and got is not _OUT_OF_RANGE:
            return got

    # 4. the last line starts with a letter
    if len(lines) > 1 and not listing:
        got = _letter_at_start(lines[-1], letters, options)
        if got and got is not _OUT_OF_RANGE:
            return got

    # 5. exactly one letter mentioned as "option X" / "(X)"
    mentioned = _mentioned_letters(t)
    if len(mentioned) == 1:
        (only,) = mentioned
        return only if only in letters else None

    # 6. the option's own text -- unless the response opens with a different bare capital
    # letter ("C Paris" when Paris is option A is contradictory; "A"/"I" are English words)
    got = (_option_match(_strip_answer_prefix(t), options, letters, whole=True)
           or _option_match(t, options, letters, whole=False))
    lead = re.match(r"([B-HJ-Z])\s", t)
    if got and lead and lead.group(1) in letters and lead.group(1) != got:
        return None
    return got
