"""Multiple-choice parser: a free-form response -> the letter of the chosen option.

Evidence is tried strongest first; the first step that decides wins:

1. **Answer markers** (``Answer: B``, ``The correct option is (b).``, ``I'd go with C``...):
   the *last* marker followed by a letter (or by an option's text) decides. A letter outside
   the item's options after a marker (``Answer: F`` with 3 options) is a decision that cannot
   be scored: unparseable.
2. **The response starts with a letter** (``B``, ``B.``, ``(B)``, ``b)``, ``B. Paris``,
   ``B is correct``). A letter followed by an ordinary word (``A person who...``,
   ``I think...``) is not an answer unless that word starts the option's own text.
3. **Conclusion words** (``Therefore, C.``, ``So B``): the last one followed by a letter.
4. **The last line starts with a letter** (CoT that ends with a bare ``D.``).
5. **Unique mention** (``Option B``, ``(C)``, ``choice c.``): exactly one distinct letter
   mentioned so. The letter must sit in an answer-like position on the keyword's own line:
   in brackets, an upper-case letter, or a lower-case letter followed by punctuation, the end
   of its line or a verdict (``option b is correct``). A lower-case ``a`` followed by a word is
   the English article (``To answer a question ...``, ``the choice a reader makes``), not a
   letter: a chain-of-thought cut off before its answer stays unparseable instead of reading A.
6. **Option text** (needs the item): the response is, or contains exactly one of, the
   options' texts (whole words, case- and punctuation-insensitive; an option contained in a
   longer matched option gives way to it), unless the response opens with a different bare
   capital letter (``C Paris`` where Paris is option A).

Before step 1 a lower-case ``a`` that ends the response right after a word (``... so, to
answer a``) is dropped: the output was cut off after an article. After ``is``, ``was``,
``be``, ``option``, ``choice`` or ``letter`` it stays a letter (``The answer is a``).

Steps 2 and 4 are skipped when several lines start with different letters: an echo of the
option list is not an answer. Anything else (``Neither A nor B``, empty text, a hedge) is unparseable.
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
