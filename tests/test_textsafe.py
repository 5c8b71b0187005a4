"""Names from input files stay text: on a terminal (certify's text view, error messages), in
the Markdown report, and in CSVs (formula prefixes; tests/test_certify.py -k formula)."""

from __future__ import annotations

import pandas as pd

from conftest import run_cli
from safetyrepro.analysis.report_md import md_table
from safetyrepro.errors import DataError
from safetyrepro.textsafe import markdown_safe, terminal_safe

EVIL = "m\x1b[2J\x1b]0;owned\x07\u202eev\rx"


def test_terminal_safe_escapes_controls_and_format_characters():
    assert terminal_safe(EVIL) == "m\\x1b[2J\\x1b]0;owned\\x07\\u202eev\\x0dx"
    assert terminal_safe("caf\u00e9 \u6a21\u578b-1") == "caf\u00e9 \u6a21\u578b-1"   # printable text unchanged
    assert terminal_safe("a\nb\tc", keep_newlines=True) == "a\nb\\x09c"
    assert terminal_safe(terminal_safe(EVIL)) == terminal_safe(EVIL)


def test_error_messages_are_terminal_safe():
    err = DataError("t\x1b.csv", f"duplicate rows: ({EVIL}, b)\nsecond line")
    assert "\x1b" not in str(err) and "\u202e" not in str(err) and "\nsecond line" in str(err)


def test_certify_text_output_escapes_names(tmp_path):
    p = tmp_path / "t.parquet"
    pd.DataFrame([(EVIL, "b\x1b[31m", "c1", 0.5), ("B", "b\x1b[31m", "c1", 0.4),
                  (EVIL, "b\x1b[31m", "c2", 0.3), ("B", "b\x1b[31m", "c2", 0.4)],
                 columns=["model", "benchmark", "config", "score"]).to_parquet(p)
    r = run_cli("certify", str(p))
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\u202e" not in r.stdout and "\r" not in r.stdout
    assert "m\\x1b[2J" in r.stdout and "b\\x1b[31m" in r.stdout
    dup = tmp_path / "dup.parquet"
    pd.concat([pd.read_parquet(p)] * 2).to_parquet(dup)
    r = run_cli("certify", str(dup))
    assert r.returncode == 2 and "duplicate" in r.stderr and "\x1b" not in r.stderr


def test_markdown_cells_render_as_the_text():
    assert markdown_safe("<img src=x onerror=alert(1)>") == "&lt;img src=x onerror=alert(1)&gt;"
    assert markdown_safe("[x](javascript:alert(1)) a|b `c` \\") == "\\[x\\](javascript:alert(1)) a\\|b \\`c\\` \\\\"
    table = md_table(pd.DataFrame({"model": ["<script>x</script>|", "ok-1"], "score": [0.5, 0.25]}))
    assert "<script>" not in table and "&lt;script&gt;x&lt;/script&gt;\\|" in table and "| ok-1 | 0.250 |" in table
