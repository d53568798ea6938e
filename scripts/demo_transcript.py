"""Write what ``make demo`` printed into docs/getting-started.md.

    make demo 2>&1 | tee /tmp/demo.log
    .venv/bin/python scripts/demo_transcript.py /tmp/demo.log

The transcript replaces the code block after the page's ``<!-- demo transcript -->`` line.
Spark's and the JVM's own log lines and the jobs' progress ticks are left out; paths under
the checkout are made relative. tests/test_docs.py checks that the page shows the demo's
current steps.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "getting-started.md"
MARKER = "<!-- demo transcript -->"
# Lines of Spark, the JVM and make, not the demo's; and a stage's progress while it runs.
NOISE = re.compile(
    r"^(WARNING: |Using Spark's |Setting default log level|To adjust logging level|"
    r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d [A-Z]+ |\.venv/bin/featureline |\[[\d:]+\] \w+: \d+s, )")


def transcript(log: str) -> str:
    """The demo's own lines of ``log``, paths relative to the checkout."""
    lines = [line.replace(f"{REPO}/", "") for line in log.splitlines()
             if not NOISE.match(line)]
    return "\n".join(lines)


def splice(page: str, text: str) -> str:
    """``page`` with the code block after its marker replaced by ``text``."""
    head, marker, tail = page.partition(MARKER)
    if not marker:
        raise SystemExit(f"{PAGE}: no {MARKER!r} line")
    start = tail.index("```\n")
    end = tail.index("\n```", start + 4)
    return f"{head}{marker}{tail[:start]}```\n{text}{tail[end:]}"


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    text = transcript(Path(sys.argv[1]).read_text())
    PAGE.write_text(splice(PAGE.read_text(), text))
    print(f"{PAGE.relative_to(REPO)}: {len(text.splitlines())} lines of the demo")


if __name__ == "__main__":
    main()
