"""Untrusted text stays text: names read from input files (models, benchmarks, items, configs)
shown on a terminal, in Markdown/HTML or in a spreadsheet cannot act there.

:func:`terminal_safe` writes control and invisible format characters (ANSI escapes, bidi
overrides) as visible escapes (``\\x1b``, ``\\u202e``); :func:`markdown_safe` adds HTML
escaping and escapes Markdown's table and link syntax; spreadsheet formulas are neutralised by
:func:`safetyrepro.io.spreadsheet_safe` in ``io.write_csv``.
"""

from __future__ import annotations

import html
import unicodedata

def _escape(ch: str) -> str:
    o = ord(ch)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def _unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp")


def terminal_safe(text, keep_newlines: bool = False) -> str:
    """``text`` (any value: str() of it) with every control or format character escaped;
    ``keep_newlines``: newlines stay (for multi-line messages), the rest is escaped."""
    s = str(text)
    if all(not _unsafe(ch) for ch in s):
        return s
    return "".join(ch if (keep_newlines and ch == "\n") else _escape(ch) if _unsafe(ch) else ch for ch in s)


def frame_terminal_safe(df):
    """A copy of a pandas frame whose text cells and column names are :func:`terminal_safe`."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object or str(out[col].dtype) in ("string", "str"):
            out[col] = out[col].map(lambda v: terminal_safe(v) if isinstance(v, str) else v)
    out.columns = [terminal_safe(c) if isinstance(c, str) else c for c in out.columns]
    return out


_MD = str.maketrans({c: "\\" + c for c in "\\|`[]"})


def markdown_safe(text) -> str:
    """A table cell of Markdown that renders as ``text`` itself: no HTML, link or code syntax,
    no cell break, control characters escaped (emphasis marks are left: they only restyle)."""
    return html.escape(terminal_safe(text), quote=False).translate(_MD)
