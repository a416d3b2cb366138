"""User text shown as text: control characters escaped for terminals, Markdown made literal for the dashboard."""
import pytest

from specmon.core.text import markdown_literal, printable


def test_printable_escapes_what_a_terminal_would_obey():
    assert printable("run\x1b[31mRED\x1b[0m") == "run\\x1b[31mRED\\x1b[0m"
    assert printable("a\nb\tc\rd\x00") == "a\\nb\\tc\\rd\\x00"
    assert printable("left\u202eright\u200b") == "left\\u202eright\\u200b"  # bidi override, zero-width space
    assert printable("\x9b31m") == "\\x9b31m"  # the one-byte CSI of C1
    assert printable("café 日本 ✔ -- **x**") == "café 日本 ✔ -- **x**"  # printable text is left alone


@pytest.mark.parametrize("name", ["![p](http://127.0.0.1:9/p.png)", "**x**", "a--b", "<img src=x onerror=1>",
                                  ":red[y] :smile: :material/home:", "$x^2$", "# h", "1. a", "- a", "> q",
                                  "`code`", "a\\*b", "&amp;", "[l](javascript:alert(1))", "~~s~~", "| a |"])
def test_markdown_literal_escapes_every_punctuation_mark(name):
    out = markdown_literal(name)
    # Every ASCII punctuation character arrives backslashed, so CommonMark reads it as itself.
    stripped = out.replace("\u2060", "")
    i = 0
    for ch in name:
        if not ch.isalnum() and ch.isascii() and not ch.isspace():
            assert stripped[i] == "\\" and stripped[i + 1] == ch, (name, out)
            i += 2
        else:
            assert stripped[i] == ch
            i += 1
    assert i == len(stripped)


def test_markdown_literal_breaks_what_is_rewritten_after_escapes_with_an_invisible_word_joiner():
    wj = "\u2060"
    assert markdown_literal("see http://h/x") == f"see http{wj}\\:{wj}\\/\\/h\\/x"  # no bare-URL link
    assert markdown_literal("www.h.com") == f"www{wj}\\.h\\.com"
    assert markdown_literal("a@b.com") == f"a{wj}\\@b\\.com"  # no mailto link
    assert markdown_literal("a -- b -> c") == f"a \\-{wj}\\- b \\-{wj}\\> c"  # Streamlit's " -- " is an em dash
    assert markdown_literal(":streamlit:") == f"\\:{wj}streamlit\\:{wj}"  # and its logo
    assert markdown_literal("x\x1b[1m") == "x\\\\x1b\\[1m"  # control characters first, then the backslash itself
