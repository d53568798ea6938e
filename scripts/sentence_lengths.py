"""How long the guide's sentences are: each page's mean and 90th-percentile sentence length in
words, prose only.

    .venv/bin/python scripts/sentence_lengths.py README.md docs/*.md

Code blocks, tables, headings, images and HTML comments are left out. Inline code counts as
one word and a link as its text. A list item is a paragraph of its own. A sentence ends at
".", "!" or "?" before a capital letter, a backtick, a bracket or a parenthesis.
tests/test_docs.py holds the pages written for readers under MAX_MEAN and MAX_P90.
"""

from __future__ import annotations

import math
import re
import statistics
import sys
from pathlib import Path

MAX_MEAN = 20
MAX_P90 = 35
_FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.DOTALL | re.MULTILINE)
_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\[(\"])")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def paragraphs(markdown: str) -> list[str]:
    """The prose of a page: each paragraph and each list item, on one line."""
    found: list[str] = []
    current: list[str] = []
    for line in _FENCE.sub("", re.sub(r"<!--.*?-->", "", markdown, flags=re.DOTALL)
                           ).splitlines():
        text = line.strip()
        item = re.match(r"^([-*]|\d+\.)\s+", text)
        if not text or text.startswith(("|", "#", "<", "![")) or item:
            if current:
                found.append(" ".join(current))
            current = [text[item.end():]] if item else []
        else:
            current.append(text)
    if current:
        found.append(" ".join(current))
    return [p for p in found if p]


def sentence_lengths(markdown: str) -> list[int]:
    """Words per sentence of a page's prose."""
    lengths = []
    for paragraph in paragraphs(markdown):
        for sentence in _END.split(paragraph):
            plain = _LINK.sub(r"\1", re.sub(r"`[^`]*`", "code", sentence))
            if plain.split():
                lengths.append(len(plain.split()))
    return lengths


def summary(lengths: list[int]) -> tuple[float, int]:
    """The mean and the 90th percentile (nearest rank) of ``lengths``."""
    ranked = sorted(lengths)
    return statistics.mean(ranked), ranked[math.ceil(0.9 * len(ranked)) - 1]


def main() -> None:
    for name in sys.argv[1:]:
        lengths = sentence_lengths(Path(name).read_text())
        if lengths:
            mean, p90 = summary(lengths)
            print(f"{name:32s} {len(lengths):4d} sentences  mean {mean:5.1f}  p90 {p90:4d}")


if __name__ == "__main__":
    main()
