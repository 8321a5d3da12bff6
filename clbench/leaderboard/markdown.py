"""Text from files, written into Markdown as literal text: a received entry or ``suite.json``
may say anything, and no word of it may turn into a link, a heading or a table cell."""

from __future__ import annotations

import re

# What a Markdown renderer would read as markup in text taken from files (suite.json, entries):
# emphasis, code, links and images, tables, strikethrough, and an HTML tag or autolink (a "<"
# before a letter, "/", "!" or "?"). "_" inside a word (seq_lora) is not emphasis.
_MD_PUNCT = re.compile(r"[\\`*\[\]|~]|<(?=[A-Za-z/!?])|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_MD_BLOCK = re.compile(r"^(?:[#>+=-]|\d+(?=[.)]))")  # a heading, quote, list or rule where a line starts


def md_text(value: object) -> str:
    """``value`` as literal Markdown text on one line: every character that would be markup
    backslash-escaped (CommonMark shows the character itself), ordinary words left as they are."""
    text = _MD_PUNCT.sub(lambda m: "\\" + m.group(0), " ".join(str(value).split()))
    return _MD_BLOCK.sub(lambda m: m.group(0) + "\\" if m.group(0)[0].isdigit() else "\\" + m.group(0), text)


def md_code(value: object) -> str:
    """``value`` as a Markdown code span, fenced by more backticks than it holds (nothing inside is markup)."""
    text = " ".join(str(value).split())
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {text} {fence}" if longest else f"{fence}{text}{fence}"
