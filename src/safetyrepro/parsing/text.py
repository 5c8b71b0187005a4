"""Text helpers shared by the free-form parsers: normalisation and phrase matching.

Everything here is total: it accepts any ``str`` (and treats non-strings as empty) and never
raises, so the parsers built on it never raise either.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

# Characters mapped before parsing: typographic quotes/dashes to ASCII, zero-width marks away.
_TRANSLATE = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u02bc": "'", "\u2032": "'",
    "\u201c": '"', "\u201d": '"', "\u00ab": '"', "\u00bb": '"',
    "\u2013": "-", "\u2014": "-", "\u2212": "-",
    "\u200b": None, "\u200c": None, "\u200d": None, "\u2060": None, "\ufeff": None,
    "\u00a0": " ",
})
_SPECIAL_TOKEN = re.compile(r"<\|[^|<>\n]{0,40}\|>|</?s>|<(?:end_of_turn|start_of_turn|eos|bos|pad)>")
_HTML_TAG = re.compile(r"</?(?:b|i|u|strong|em|p|br|code|answer)\s*/?>", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{\s*([^{}\n]{1,80}?)\s*\}")
_MARKDOWN = re.compile(r"[*_`#~]+")
_SPACES = re.compile(r"[ \t\r\f\v]+")


def normalize(text: object) -> str:
    """NFKC-normalised text with markdown emphasis, HTML emphasis tags, chat special tokens
    and typographic punctuation removed or mapped to ASCII; ``\\boxed{X}`` becomes
    ``Answer: X``. Line breaks are kept (parsers look at lines); runs of spaces collapse."""
    if not isinstance(text, str):
        return ""
    t = unicodedata.normalize("NFKC", text).translate(_TRANSLATE)
    t = _SPECIAL_TOKEN.sub(" ", t)
    t = _HTML_TAG.sub(" ", t)
    t = _BOXED.sub(lambda m: f"\nAnswer: {m.group(1)}\n", t)
    t = _MARKDOWN.sub("", t)
    t = _SPACES.sub(" ", t)
    return "\n".join(line.strip() for line in t.split("\n")).strip()


def has_content(text: str) -> bool:
    """True iff the text holds at least one letter or digit (of any script)."""
    return any(ch.isalnum() for ch in text)


def _phrase_pattern(phrase: str) -> str:
    words = [re.escape(w) for w in phrase.strip().split()]
    return r"\s+".join(words)


@lru_cache(maxsize=256)
def phrase_regex(phrases: tuple[str, ...]) -> re.Pattern | None:
    """Case-insensitive regex matching any phrase as whole words (longest first, so at one
    position ``not hateful`` wins over ``not``). None for an empty list."""
    cleaned = sorted({p.strip().lower() for p in phrases if p.strip()}, key=lambda p: (-len(p), p))
    if not cleaned:
        return None
    body = "|".join(_phrase_pattern(p) for p in cleaned)
    return re.compile(rf"(?<![\w'])(?:{body})(?![\w])", re.IGNORECASE)


# What may follow an answer marker before the answer itself: "to this question", "is",
# "would be", a colon, dash or equals sign (in any combination), e.g. "answer to the question
# is: B", "Final answer - B", "correct option would be (C)".
_MARKER_TAIL = re.compile(
    r"(?:\s+(?:to|for)\s+(?:this|the|that)\s+(?:question|statement|prompt|request|one))?"
    r"(?:\s*(?:(?:is|was|would\s+be|will\s+be|should\s+be|must\s+be)\b|[:=,-]))*\s*",
    re.IGNORECASE,
)


def marker_segments(text: str, markers: tuple[str, ...], *, to_end: bool = False,
                    last: int = 16, max_len: int = 300) -> list[str]:
    """The text following each of the ``last`` final occurrences of any marker phrase, up to
    the end of that line (at most ``max_len`` characters), or to the end of the whole text
    when ``to_end``; in order of occurrence. The caps keep parsing linear on long inputs."""
    rx = phrase_regex(markers)
    if rx is None:
        return []
    segments = []
    for m in list(rx.finditer(text))[-last:]:
        tail = _MARKER_TAIL.match(text, m.end(), m.end() + max_len)
        start = tail.end() if tail else m.end()
        if to_end:
            seg = text[start:]
        else:
            nl = text.find("\n", start, start + max_len)
            seg = text[start: start + max_len] if nl < 0 else text[start:nl]
        segments.append(seg.strip())
    return segments


def norm_words(text: str) -> str:
    """Lower-case words separated by single spaces, padded with one space each side, for
    whole-word containment tests (``" paris " in norm_words(resp)``)."""
    low = re.sub(r"\bcan(?:'t|\s+not)\b", "cannot", text.lower())
    words = re.findall(r"\w+", low)
    return " " + " ".join(words) + " " if words else ""
