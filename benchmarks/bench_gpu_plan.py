"""What the explain-only check costs: `featureline etl gpu-check` (the RAPIDS Accelerator
planning every query, no GPU) against `featureline etl run` on the cpu profile, same log.

Prints one JSON document. Each run is its own process (each pays its JVM's start, the
check also the 1 GB plugin jar on its class path); the two are interleaved, pair by pair,
on this noisy machine, and the ratio is the median of the pairs' ratios.

    python benchmarks/bench_gpu_plan.py                        # 200k events, 3 pairs
    python benchmarks/bench_gpu_plan.py --events 3000 --pairs 1  # the smoke size
    python benchmarks/bench_gpu_plan.py --incremental  # also the last day's incremental plan
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from featureline.etl.datagen import last_day_apart, write_log
from featureline.etl.rapids import RAPIDS_VERSION
from featureline.tools import plugin_jar

FEATURELINE = str(Path(sys.executable).parent / "featureline")


def _timed(command: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=cwd)
    return time.perf_counter() - start, done


def _run_ok(command: list[str], cwd: Path) -> float:
    seconds, done = _timed(command, cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} failed: {done.stderr[-2000:]}")
    return seconds


def run(events: int, pairs: int, log: Path | None = None, config: str | None = None,
        incremental: bool = False, baseline: bool = True) -> dict[str, Any]:
    """``log``: the events to run on (else ``events`` generated ones); ``config``: the text of
    a ``featureline.yaml`` every command reads (an aggregations spec, say). ``check_report``
    is the last check's own JSON report and ``check_exit`` its exit status (1 when any
    operator is off the GPU) — what the gpu-check test reads, without a run of its own.
    ``incremental``: the runs take every day but the last, and a last check plans the
    incremental run of the last day on the output the check before wrote
    (``incremental_report``, ``incremental_exit``, ``gpu_check_incremental_s``).
    ``baseline``: False runs the checks alone, without the cpu runs and their ratio (the
    test suite reads only the checks' reports)."""
    jar = plugin_jar()
    with tempfile.TemporaryDirectory(prefix="bench-gpu-plan-") as work:
        folder = Path(work)
        raw = log or folder / "events.jsonl"
        if log is None:
            write_log(raw, events=events, users=max(100, events // 40),
                      items=max(50, events // 100), days=14, seed=3, bad_fraction=0.01)
        if config is not None:
            (folder / "featureline.yaml").write_text(config)
        if incremental:
            history, new_day = folder / "events-history.jsonl", folder / "events-new.jsonl"
            last_day_apart(raw, history, new_day)
            raw = history
        common = ["--input", str(raw), "--refit-vocabularies"]
        cpu = [FEATURELINE, "etl", "run", "--profile", "cpu",
               "--output", str(folder / "cpu"), *common]
        check = [FEATURELINE, "etl", "gpu-check", "--jar", str(jar), "--json",
                 "--output", str(folder / "check"), *common]
        runs = []
        for _ in range(pairs):
            cpu_seconds = _run_ok(cpu, folder) if baseline else None
            seconds, checked = _timed(check, folder)
            if not checked.stdout:  # it failed before planning: no report
                raise RuntimeError(f"etl gpu-check failed: {checked.stderr[-2000:]}")
            runs.append((cpu_seconds, seconds))
        if incremental:
            day_check = [FEATURELINE, "etl", "gpu-check", "--jar", str(jar), "--json",
                         "--output", str(folder / "check"), "--input", str(new_day),
                         "--incremental"]
            day_seconds, day_checked = _timed(day_check, folder)
            if not day_checked.stdout:
                raise RuntimeError(f"etl gpu-check --incremental failed: "
                                   f"{day_checked.stderr[-2000:]}")
    timed = [(b, c) for b, c in runs if b is not None]
    report = {
        "benchmark": "gpu_plan", "machine": platform.machine(), "python": platform.python_version(),
        "plugin": RAPIDS_VERSION, "events": events if log is None else None, "pairs": pairs,
        "etl_run_cpu_s": [round(b, 1) for b, _ in timed],
        "gpu_check_s": [round(c, 1) for _, c in runs],
        "extra_s_median": (round(statistics.median(c - b for b, c in timed), 1)
                           if timed else None),
        "ratio_vs_etl_run_median": (round(statistics.median(c / b for b, c in timed), 3)
                                    if timed else None),
        "check_exit": checked.returncode,
        "check_report": json.loads(checked.stdout),
        "check_stderr_tail": checked.stderr[-3000:] if checked.returncode else "",
    }
    if incremental:
        report.update({
            "gpu_check_incremental_s": round(day_seconds, 1),
            "incremental_exit": day_checked.returncode,
            "incremental_report": json.loads(day_checked.stdout),
            "incremental_stderr_tail": (day_checked.stderr[-3000:]
                                        if day_checked.returncode else ""),
        })
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--incremental", action="store_true",
                        help="also plan the incremental run of the log's last day")
    args = parser.parse_args()
    report = run(args.events, args.pairs, incremental=args.incremental)
    # The plan's every stage: `featureline etl gpu-check --json`.
    report.pop("check_report")
    report.pop("incremental_report", None)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
