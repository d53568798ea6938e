"""Where the suite's CPU goes: each test phase's CPU seconds — the worker's own, its finished
children's and every live descendant's (the shared Spark JVM, a Kafka broker, Redis servers,
a spark-submit) — one JSON line per phase into ``$FEATURELINE_TEST_CPU/<worker>.jsonl``.

    FEATURELINE_TEST_CPU=/tmp/cpu PYTEST_ARGS="-p tests.cpu_profile" make test
    python -m tests.cpu_profile /tmp/cpu        # the costliest tests and each file's total
    python -m tests.cpu_profile table /tmp/cpu  # the same as benchmarks/README.md's tables
    python -m tests.cpu_profile order /tmp/cpu  # tests/module_seconds.json: the suite's order
    python -m tests.cpu_profile watch /tmp/procs.json   # beside it, until SIGTERM

``watch`` samples every process of the machine each second — its CPU, command line and the
``PYTEST_CURRENT_TEST`` it was started under (inherited by a subprocess, even one that leaves
the worker's tree) — and writes them as JSON when stopped: what the plugin cannot see.

The suite is CPU-bound on the 2-core CI machine (benchmarks/README.md, "The suite's time"),
so its wall time follows these seconds, not the tests' durations, which share the cores."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

_TICK = os.sysconf("SC_CLK_TCK")


def _pids() -> list[str]:
    return [entry.name for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _stat_fields(pid: str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command's name (the state first); None
    once the process is gone."""
    try:
        stat = (Path("/proc") / pid / "stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def _descendants_cpu(root: int) -> float:
    """CPU seconds of every live descendant of ``root``, each with its waited-for children."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for name in _pids():
        fields = _stat_fields(name)
        if fields is None:
            continue
        pid = int(name)
        parents[pid] = int(fields[1])
        cpu[pid] = sum(int(v) for v in fields[11:15]) / _TICK
    total = 0.0
    for pid, seconds in cpu.items():
        ancestor = parents.get(pid)
        while ancestor not in (None, 0, 1, root):
            ancestor = parents.get(ancestor)
        if ancestor == root:
            total += seconds
    return total


def _cpu() -> float:
    times = os.times()
    return (times.user + times.system + times.children_user + times.children_system
            + _descendants_cpu(os.getpid()))


def _out() -> Path | None:
    folder = os.environ.get("FEATURELINE_TEST_CPU")
    if not folder:
        return None
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder) / f"{worker}.jsonl"


# The ETL job runs of the phase under way in this process: how many, and their wall seconds.
_JOB_RUNS = {"runs": 0, "seconds": 0.0}


def pytest_configure(config) -> None:
    """Counts the job runs each phase makes in the test's own process (``etl.job.run``, the
    shared session's); a job in a process of its own shows in its CPU only."""
    if _out() is None:
        return
    from featureline.etl import job

    run = job.run

    def counted(*args, **kwargs):
        started = time.monotonic()
        try:
            return run(*args, **kwargs)
        finally:
            _JOB_RUNS["runs"] += 1
            _JOB_RUNS["seconds"] += time.monotonic() - started

    job.run = counted


def _measured(item, phase: str):
    out = _out()
    wall, cpu = time.monotonic(), _cpu()
    _JOB_RUNS.update(runs=0, seconds=0.0)
    yield
    if out is not None:
        with out.open("a") as file:
            file.write(json.dumps({"test": item.nodeid, "phase": phase,
                                   "wall_s": round(time.monotonic() - wall, 2),
                                   "cpu_s": round(_cpu() - cpu, 2),
                                   "job_runs": _JOB_RUNS["runs"],
                                   "job_s": round(_JOB_RUNS["seconds"], 2)}) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _measured(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _measured(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _measured(item, "teardown")


def _rows(folder: Path) -> list[dict]:
    """Every phase the workers recorded under ``folder``."""
    return [json.loads(line) for path in sorted(folder.glob("*.jsonl"))
            for line in path.read_text().splitlines()]


def summary(folder: Path, top: int = 40) -> str:
    rows = _rows(folder)
    by_file: dict[str, float] = defaultdict(float)
    for row in rows:
        by_file[row["test"].split("::")[0]] += row["cpu_s"]
    lines = [f"total {sum(r['cpu_s'] for r in rows) / 60:.1f} CPU-min over {len(rows)} phases"]
    lines += [f"{r['cpu_s']:8.1f} cpu {r['wall_s']:8.1f} wall  {r['phase']:8} {r['test']}"
              for r in sorted(rows, key=lambda r: -r["cpu_s"])[:top]]
    lines += ["", "by file:"]
    lines += [f"{s:8.1f}  {f}" for f, s in sorted(by_file.items(), key=lambda i: -i[1])]
    return "\n".join(lines)


def table(folder: Path, top: int = 25) -> str:
    """benchmarks/README.md's "Suite" tables in Markdown: each file's CPU and wall seconds,
    tests and in-process job runs, the costliest first (those under 30 s in one row); then
    the ``top`` costliest phases."""
    rows = _rows(folder)
    files: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in rows:
        entry = files[row["test"].split("::")[0].removeprefix("tests/")]
        entry["cpu_s"] += row["cpu_s"]
        entry["wall_s"] += row["wall_s"]
        entry["job_runs"] += row.get("job_runs", 0)
        entry["tests"] += row["phase"] == "call"
    total_cpu = sum(r["cpu_s"] for r in rows)
    counted = any("job_runs" in row for row in rows)  # recorded by this plugin's later form
    runs_head = (" job runs |", "---|") if counted else ("", "")
    lines = [f"{len(files)} files, {sum(e['tests'] for e in files.values()):.0f} tests, "
             f"{total_cpu / 60:.1f} CPU-min in the phases (workers' own processes and their "
             f"children)" + (f"; {sum(e['job_runs'] for e in files.values()):.0f} job runs in "
                             "them." if counted else "."),
             "", f"| file | CPU s | wall s | tests |{runs_head[0]}",
             f"|---|---|---|---|{runs_head[1]}"]
    rest = []
    for name, entry in sorted(files.items(), key=lambda item: -item[1]["cpu_s"]):
        if max(entry["cpu_s"], entry["wall_s"]) < 30:
            rest.append(entry)
            continue
        runs = f" {entry['job_runs']:.0f} |" if counted else ""
        lines.append(f"| {name} | {entry['cpu_s']:.0f} | {entry['wall_s']:.0f} | "
                     f"{entry['tests']:.0f} |{runs}")
    lines.append(f"| {len(rest)} more files, each under 30 s | "
                 f"{sum(e['cpu_s'] for e in rest):.0f} | {sum(e['wall_s'] for e in rest):.0f} | "
                 f"{sum(e['tests'] for e in rest):.0f} |{' |' if counted else ''}")
    lines += ["", f"| phase | test | CPU s | wall s |{runs_head[0]}",
              f"|---|---|---|---|{runs_head[1]}"]
    for row in sorted(rows, key=lambda r: -r["cpu_s"])[:top]:
        jobs = ""
        if counted:
            jobs = f" {row['job_runs']} ({row['job_s']:.0f} s) |" if row.get("job_runs") else " |"
        lines.append(f"| {row['phase']} | `{row['test'].removeprefix('tests/')}` | "
                     f"{row['cpu_s']:.0f} | {row['wall_s']:.0f} |{jobs}")
    return "\n".join(lines)


def module_seconds(folder: Path) -> dict[str, float]:
    """Each test module's wall seconds (its phases' sum), the costliest first: the order
    tests/conftest.py runs them in (tests/module_seconds.json)."""
    seconds: dict[str, float] = defaultdict(float)
    for row in _rows(folder):
        seconds[Path(row["test"].split("::")[0]).name] += row["wall_s"]
    return {name: round(value) for name, value in
            sorted(seconds.items(), key=lambda item: -item[1])}


def _stat(pid: str) -> tuple[int, int] | None:
    """(CPU ticks, start time) of a process; None once it is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12]), int(fields[19]))


def _started_under(pid: str) -> dict[str, str] | None:
    try:
        environ = (Path("/proc") / pid / "environ").read_bytes().split(b"\0")
        command = (Path("/proc") / pid / "cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return None
    test = next((entry.partition(b"=")[2] for entry in environ
                 if entry.startswith(b"PYTEST_CURRENT_TEST=")), b"")
    return {"command": command[:300].decode(errors="replace"),
            "test": test.decode(errors="replace")}


def watch(out: Path) -> None:
    """Sample every process each second until SIGTERM, then write them to ``out``."""
    seen: dict[tuple[str, int], dict] = {}

    def stop(*_) -> None:
        for entry in seen.values():
            entry["cpu_s"] = round(entry.pop("ticks") / _TICK, 2)
        out.write_text(json.dumps(list(seen.values())))
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        for pid in _pids():
            stat = _stat(pid)
            if stat is None:
                continue
            if (pid, stat[1]) not in seen:
                started = _started_under(pid)
                if started is None:
                    continue
                seen[(pid, stat[1])] = {"pid": int(pid), **started}
            seen[(pid, stat[1])]["ticks"] = stat[0]
        time.sleep(1)


if __name__ == "__main__":
    if sys.argv[1] == "watch":
        watch(Path(sys.argv[2]))  # until SIGTERM, which exits
    elif sys.argv[1] == "table":
        print(table(Path(sys.argv[2])))
    elif sys.argv[1] == "order":
        order = Path(__file__).with_name("module_seconds.json")
        order.write_text(json.dumps(module_seconds(Path(sys.argv[2])), indent=0) + "\n")
    else:
        print(summary(Path(sys.argv[1])))
