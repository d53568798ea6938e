"""Which tests catch a broken rule? Five rules of the project, each changed in its source file
one at a time, and the test modules that check it run against the change: the tests that
fail are the ones that catch it (none failing: the rule is unguarded). The file is put
back after each run, whatever happens.

Prints one JSON document; ``--markdown`` prints benchmarks/README.md's table instead.

    python benchmarks/mutations.py                    # every rule
    python benchmarks/mutations.py --only hop_rounding --markdown
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str
    rule: str  # what the change breaks, in words
    path: str  # the file changed, from the repository's root
    old: str  # text found exactly once in it
    new: str
    modules: tuple[str, ...]  # the test modules run against the change


MUTATIONS = (
    Mutation("label_window", "the label join's window: a positive counts twice as long after",
             "etl/label_join.py", "(next_positive <= t + F.lit(within))",
             "(next_positive <= t + F.lit(2 * within))", ("tests/test_label_join.py",)),
    Mutation("hop_rounding", "a window's start rounded up to its hop, not down",
             "core/time_rule.py", "    return floor_to(t - length, hop)\n",
             "    return floor_to(t - length + hop - 1, hop)\n",
             ("tests/test_time_rule.py", "tests/test_aggregations.py")),
    Mutation("tile_merge", "two counts' tiles merged by the larger, not the sum",
             "core/operations/sums.py", "    def merge(self, left: int, right: int) -> int:\n"
             "        return left + right\n",
             "    def merge(self, left: int, right: int) -> int:\n"
             "        return max(left, right)\n",
             ("tests/test_aggregations.py", "tests/test_stream_tiles.py")),
    Mutation("gate_threshold", "the gate's volume check never breaches",
             "core/drift.py",
             'yield Measurement("volume", "", value, threshold, value > threshold)',
             'yield Measurement("volume", "", value, threshold, value > threshold + 1)',
             ("tests/test_drift.py", "tests/test_drift_window.py")),
    Mutation("model_input_transform", "the served log1p_standardize shifts log1p by one",
             "core/transforms.py", "np.log1p(np.maximum(raw, 0.0))",
             "np.log1p(np.maximum(raw, 0.0) + 1.0)", ("tests/test_model_inputs.py",)),
)

_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+::\S+)", re.MULTILINE)


def run_one(mutation: Mutation, workers: int) -> dict:
    path = REPO / mutation.path
    original = path.read_text()
    if original.count(mutation.old) != 1:
        raise SystemExit(f"{mutation.name}: the text to change is not once in {mutation.path}")
    started = time.perf_counter()
    path.write_text(original.replace(mutation.old, mutation.new))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
             "-n", str(workers), "--dist", "loadfile", *mutation.modules],
            cwd=REPO, capture_output=True, text=True, check=False)
    finally:
        path.write_text(original)
    caught = sorted(set(_FAILED.findall(done.stdout)))
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    return {"rule": mutation.rule, "file": mutation.path, "modules": list(mutation.modules),
            "caught_by": caught, "summary": summary,
            "seconds": round(time.perf_counter() - started, 1)}


def markdown(report: dict) -> str:
    lines = ["| rule changed | modules run | tests that fail |", "|---|---|---|"]
    for name, entry in report["mutations"].items():
        tests = ", ".join(f"`{t.split('::', 1)[1]}`" for t in entry["caught_by"]) or "**none**"
        modules = ", ".join(m.removeprefix("tests/") for m in entry["modules"])
        lines.append(f"| {entry['rule']} (`{name}`) | {modules} | "
                     f"{len(entry['caught_by'])}: {tests} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="a mutation's name (repeatable)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist processes")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    report = {"benchmark": "mutations",
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                       capture_output=True, text=True).stdout.strip(),
              "mutations": {m.name: run_one(m, args.workers) for m in chosen}}
    print(markdown(report) if args.markdown else json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
