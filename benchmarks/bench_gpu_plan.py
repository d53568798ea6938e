"""What the explain-only check costs: `featureline etl gpu-check` (the RAPIDS Accelerator
planning every query, no GPU) against `featureline etl run` on the cpu profile, same log.

Prints one JSON document. Each run is its own process (each pays its JVM's start, the
check also the 1 GB plugin jar on its class path); the two are interleaved, pair by pair,
on this noisy machine, and the ratio is the median of the pairs' ratios.

    python benchmarks/bench_gpu_plan.py                        # 200k events, 3 pairs
    python benchmarks/bench_gpu_plan.py --events 3000 --pairs 1  # the smoke size
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from featureline.etl.datagen import write_log
from featureline.etl.rapids import RAPIDS_VERSION
from featureline.tools import plugin_jar

FEATURELINE = str(Path(sys.executable).parent / "featureline")


def _timed(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=cwd)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} failed: {done.stderr[-2000:]}")
    return seconds


def run(events: int, pairs: int) -> dict[str, Any]:
    jar = plugin_jar()
    with tempfile.TemporaryDirectory(prefix="bench-gpu-plan-") as work:
        folder = Path(work)
        raw = folder / "events.jsonl"
        write_log(raw, events=events, users=max(100, events // 40),
                  items=max(50, events // 100), days=14, seed=3, bad_fraction=0.01)
        common = ["--input", str(raw), "--refit-vocabularies"]
        cpu = [FEATURELINE, "etl", "run", "--profile", "cpu",
               "--output", str(folder / "cpu"), *common]
        check = [FEATURELINE, "etl", "gpu-check", "--jar", str(jar),
                 "--output", str(folder / "check"), *common]
        runs = [(_timed(cpu, folder), _timed(check, folder)) for _ in range(pairs)]
    ratios = [c / b for b, c in runs]
    return {
        "benchmark": "gpu_plan", "machine": platform.machine(), "python": platform.python_version(),
        "plugin": RAPIDS_VERSION, "events": events, "pairs": pairs,
        "etl_run_cpu_s": [round(b, 1) for b, _ in runs],
        "gpu_check_s": [round(c, 1) for _, c in runs],
        "extra_s_median": round(statistics.median(c - b for b, c in runs), 1),
        "ratio_vs_etl_run_median": round(statistics.median(ratios), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(run(args.events, args.pairs), indent=2))


if __name__ == "__main__":
    main()
