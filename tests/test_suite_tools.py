"""The suite's own tools: the per-test table and the order it is built from
(tests/cpu_profile.py), the mutations that show which tests guard a rule
(benchmarks/mutations.py), and the settings its job processes start with."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests import cpu_profile
from tests.conftest import MODULE_SECONDS
from tests.job_config import INTERPRETED
from tests.test_benchmarks import _load

REPO = Path(__file__).resolve().parent.parent


def _phases(folder: Path) -> Path:
    rows = {
        "gw0": [("tests/test_a.py::test_one", "setup", 100.0, 80.0, 2, 70.0),
                ("tests/test_a.py::test_one", "call", 5.0, 4.0, 0, 0.0),
                ("tests/test_b.py::test_two", "call", 10.0, 9.5, 1, 8.0)],
        "gw1": [("tests/test_c.py::test_three", "call", 1.0, 0.5, 0, 0.0)],
    }
    for worker, phases in rows.items():
        (folder / f"{worker}.jsonl").write_text("".join(
            json.dumps({"test": test, "phase": phase, "wall_s": wall, "cpu_s": cpu,
                        "job_runs": runs, "job_s": seconds}) + "\n"
            for test, phase, wall, cpu, runs, seconds in phases))
    return folder


def test_the_table_sums_each_file_and_ranks_the_phases(tmp_path):
    text = cpu_profile.table(_phases(tmp_path), top=2)
    lines = text.splitlines()
    assert lines[0] == ("3 files, 3 tests, 1.6 CPU-min in the phases (workers' own processes "
                        "and their children); 3 job runs in them.")
    # Files at 30 s or more one by one, the costliest first; the rest in one row.
    assert "| test_a.py | 84 | 105 | 1 | 2 |" in lines
    assert "| 2 more files, each under 30 s | 10 | 11 | 2 | |" in lines
    assert not any(line.startswith("| test_b.py") for line in lines)
    phases = lines[lines.index("| phase | test | CPU s | wall s | job runs |") + 2:]
    assert phases == ["| setup | `test_a.py::test_one` | 80 | 100 | 2 (70 s) |",
                      "| call | `test_b.py::test_two` | 10 | 10 | 1 (8 s) |"]


def test_the_order_puts_the_longest_module_first(tmp_path):
    assert cpu_profile.module_seconds(_phases(tmp_path)) == {
        "test_a.py": 105, "test_b.py": 10, "test_c.py": 1}


def test_the_committed_order_names_this_suites_modules():
    modules = {path.name for path in (REPO / "tests").glob("test_*.py")}
    assert set(MODULE_SECONDS) <= modules
    seconds = list(MODULE_SECONDS.values())
    assert seconds == sorted(seconds, reverse=True) and seconds[0] > 60


def test_each_mutation_still_finds_its_rule_and_its_modules():
    """A rule moved or reworded leaves its mutation nothing to change: the script refuses
    to run it, and this test names it first."""
    mutations = _load("mutations").MUTATIONS
    assert len({m.name for m in mutations}) == len(mutations) == 5
    for mutation in mutations:
        source = (REPO / mutation.path).read_text()
        assert source.count(mutation.old) == 1, mutation.name
        assert mutation.old != mutation.new
        assert all((REPO / module).is_file() for module in mutation.modules), mutation.name


def test_the_job_processes_the_tests_start_run_their_queries_interpreted(spark):
    options = os.environ["SPARK_SUBMIT_OPTS"].split()
    for key, value in INTERPRETED.items():
        assert f"-D{key}={value}" in options
        assert spark.conf.get(key) == value


def test_every_test_that_starts_spark_is_marked_and_test_fast_leaves_it_out(request):
    """A test that needs the shared session or the shared job's output is marked ``spark``,
    and `make test-fast` (``-m "not slow and not spark"``) selects none of them."""
    from tests.conftest import SPARK_FIXTURES

    items = request.session.items
    starting = [item for item in items if SPARK_FIXTURES & set(item.fixturenames)]
    assert all(item.get_closest_marker("spark") is not None for item in starting)
    unmarked = [item for item in items if item.get_closest_marker("spark") is None]
    assert not SPARK_FIXTURES & {name for item in unmarked for name in item.fixturenames}
    if "not spark" in request.config.getoption("markexpr"):
        assert not starting
    makefile = (REPO / "Makefile").read_text()
    assert '-m "not slow and not spark"' in makefile.split("test-fast:")[1].split("\n\n")[0]
