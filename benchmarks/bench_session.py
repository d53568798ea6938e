"""A small Spark job's cost with and without the class archive, and with the test suite's
first-tier JIT (etl/class_archive.py).

Prints one JSON document: ``featureline etl run`` on a small generated log, each run a fresh
process and JVM, three ways — without the archive (an empty cache folder), with it, and with
it and the first tier only (``SPARK_SUBMIT_OPTS``, as tests/conftest.py sets it) —
rotated run by run so that the machine's drift falls on each; wall seconds of each run and
the machine's CPU seconds over it (/proc/stat: the JVM is not this process's child), and the
ratios of the medians (with ÷ without, first tier ÷ with).

    python benchmarks/bench_session.py              # 4 pairs on 2,000 events
    python benchmarks/bench_session.py --pairs 1    # the smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from featureline.core.files import CACHE_ENV, cache_root
from featureline.etl.class_archive import SMALL_JOBS_JAVA_OPTIONS, class_archive
from featureline.etl.datagen import write_log


def machine_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent (user, nice, system, irq, softirq)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = sum(int(fields[i]) for i in (0, 1, 2, 5, 6))
    return ticks / os.sysconf("SC_CLK_TCK")


def one_run(log: Path, out: Path, cache: Path, java_options: str) -> dict[str, float]:
    command = [str(Path(sys.executable).parent / "featureline"), "etl", "run",
               "--input", str(log), "--output", str(out)]
    env = dict(os.environ, **{CACHE_ENV: str(cache), "SPARK_SUBMIT_OPTS": java_options})
    cpu, started = machine_cpu_seconds(), time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=env, timeout=900)
    return {"wall_s": round(time.perf_counter() - started, 2),
            "machine_cpu_s": round(machine_cpu_seconds() - cpu, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4, help="runs of each side")
    parser.add_argument("--events", type=int, default=2000)
    args = parser.parse_args()
    archive = class_archive()
    sides = ("with", "without", "first_tier")
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        log = root / "events.jsonl"
        write_log(log, events=args.events, users=50, items=40, days=3, seed=3,
                  bad_fraction=0.01)
        caches = {"with": cache_root(), "without": root / "empty-cache",
                  "first_tier": cache_root()}
        options = {"with": "", "without": "", "first_tier": SMALL_JOBS_JAVA_OPTIONS}
        for pair in range(args.pairs):
            for side in sides[pair % 3:] + sides[:pair % 3]:
                out = root / f"out-{side}-{pair}"
                runs[side].append(one_run(log, out, caches[side], options[side]))
    medians = {side: {key: statistics.median(run[key] for run in runs[side])
                      for key in ("wall_s", "machine_cpu_s")} for side in runs}
    print(json.dumps({
        "machine": f"{platform.node()} {os.cpu_count()} cores",
        "events": args.events, "archive": str(archive),
        "archive_mb": round(archive.stat().st_size / 2**20, 1),
        "runs": runs, "medians": medians,
        "ratio_wall": round(medians["with"]["wall_s"] / medians["without"]["wall_s"], 3),
        "ratio_cpu": round(medians["with"]["machine_cpu_s"]
                           / medians["without"]["machine_cpu_s"], 3),
        "first_tier_ratio_wall": round(medians["first_tier"]["wall_s"]
                                       / medians["with"]["wall_s"], 3),
        "first_tier_ratio_cpu": round(medians["first_tier"]["machine_cpu_s"]
                                      / medians["with"]["machine_cpu_s"], 3),
    }, indent=2))


if __name__ == "__main__":
    main()
