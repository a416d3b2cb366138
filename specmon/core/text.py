"""User text (run, template and file names, notes, fault reasons) made safe to show: pure functions, no I/O.

Names are data. A terminal obeys the control characters in a string (ANSI escapes can recolour, move the cursor
or hide text) and a Markdown renderer obeys its markup, so neither ever gets a name as it is.
"""
from __future__ import annotations

import re
import unicodedata

# Every ASCII punctuation character: CommonMark lets a backslash make any of them literal.
_MARKDOWN_PUNCTUATION = re.compile(r"([!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~])")
# Some rewriting happens on the text after escapes are resolved, so a word joiner (U+2060, invisible) goes where it
# must break a pattern: GitHub-flavoured Markdown links bare URLs and e-mail addresses; Streamlit turns " -- ",
# " -> ", " <= " and the like into typographic symbols and :streamlit: into its logo.
_BREAK = re.compile(r"(?i)(?:(?<=http)|(?<=https)|(?<=ftp)|(?<=mailto))(?=\\:)|(?<=www)(?=\\\.)|(?=\\@)"
                    r"|(?<=\\:)|(?<=\\[-<>~=])(?=\\[-<>=])")
_WORD_JOINER = "\u2060"


def printable(text: str) -> str:
    """text with every control or format character (ANSI escapes, newlines, bidi overrides) written as a
    Python-style escape, so that it prints as one visible line and changes nothing on the terminal."""
    return "".join(ch if unicodedata.category(ch) not in ("Cc", "Cf") else ch.encode("unicode_escape").decode("ascii")
                   for ch in text)


def markdown_literal(text: str) -> str:
    """Markdown that shows text exactly as printable(text) reads: no emphasis, link, image, HTML, heading, list,
    math, emoji or icon shortcode can come out of it."""
    return _BREAK.sub(_WORD_JOINER, _MARKDOWN_PUNCTUATION.sub(r"\\\1", printable(text)))
