"""The layers of docs/ARCHITECTURE.md, checked on the source: core ← stages ← the launcher
(the ``featureline`` folder, the package itself).

The import graph comes from the source files themselves (every ``import`` and ``from … import``,
including those inside functions), so a lazy import cannot hide a violation.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Each layer's folder; every module is imported as ``featureline.<stage>.…`` (the launcher's
# folder is the ``featureline`` package itself, pyproject.toml's package-dir).
LAUNCHER = "featureline"
LAYERS = {"core": 0, "etl": 1, "feature_store": 1, "hps": 1, "api": 1, "trainer": 1,
          "stream": 1, LAUNCHER: 2}
STAGES = {name for name in LAYERS if name != LAUNCHER}
# What one stage may use of another: the API serves from the feature store and the
# parameter server through these modules, and reaches into nothing else.
PUBLIC = {
    # It writes the feature log in the format the consistency job reads, and compares the
    # model inputs it logged in that job's terms.
    "api": {"feature_store.settings", "feature_store.online", "feature_store.online_store",
            "feature_store.repo", "feature_store.errors", "feature_store.feature_log",
            "feature_store.consistency", "hps",
            "hps.errors", "hps.updates", "stream.settings", "stream.log", "stream.push"},
    # The stream processor writes through the online store's protocol, in Feast's layout,
    # and the aggregations' tiles in theirs.
    "stream": {"feature_store.online_store", "feature_store.repo", "feature_store.settings",
               "feature_store.writer", "feature_store.redis_server", "feature_store.tiles"},
    # The trainer reads the TFRecords with the ETL's reader and writes HugeCTR tables and
    # the parameter server's configuration for them.
    "trainer": {"etl.tfrecord.reader", "hps.formats", "hps.config"},
}
# Files that tools run by path (spark-submit, Feast's CLI): launcher-level entry points that
# live where their tool expects them.
ENTRY_POINTS = {"etl/main.py", "feature_store/feast_repo/featureline_repo.py"}
# Packages the serving side never imports: the API process runs without Spark.
SPARK = ("pyspark",)
# The core modules with a Spark half beside their Python half (the operations, derived
# features; docs/ARCHITECTURE.md, "Features as definitions"): each imports pyspark inside the Spark
# half's functions and for type checking, never when it is loaded.
SPARK_HALVES = {"core/derive.py", *(str(path.relative_to(REPO)) for path
                                    in (REPO / "core" / "operations").glob("*.py"))}


def module_name(path: Path) -> str:
    """The module's name relative to ``featureline`` (``etl.job``; the launcher's ``cli``)."""
    parts = path.relative_to(REPO).with_suffix("").parts
    parts = parts[1:] if parts[0] == LAUNCHER else parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, absolute names (``featureline.`` kept)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            # ``from featureline.hps import formats`` imports featureline.hps.formats
            folder = source_folder(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names
                         if folder and (folder / f"{alias.name}.py").is_file())
    return names


def source_folder(module: str) -> Path | None:
    """The repository folder of the package ``featureline.…`` names, if it is one."""
    parts = module.split(".")
    if parts[0] != "featureline":
        return None
    if len(parts) > 1 and parts[1] in STAGES:
        return REPO.joinpath(*parts[1:])
    return REPO.joinpath(LAUNCHER, *parts[1:])


def layer_of(name: str) -> str | None:
    """The layer of an imported module: ``featureline.etl.job`` → ``etl``; ``featureline.cli``
    → the launcher's; anything outside the namespace → None."""
    parts = name.split(".")
    if parts[0] != "featureline":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else LAUNCHER


def import_graph() -> dict[str, tuple[str, set[str]]]:
    """module → (its file relative to the repository, the modules it imports)."""
    graph = {}
    for package in LAYERS:
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            graph[module_name(path)] = (relative, imports_of(path))
    return graph


def violations(graph: dict[str, tuple[str, set[str]]]) -> list[str]:
    """Imports that go up a layer, or across stages outside :data:`PUBLIC`, or that name a
    folder of the repository outside the ``featureline`` namespace."""
    found = []
    for path, imported in graph.values():
        package = path.split("/")[0]
        layer = 2 if path in ENTRY_POINTS else LAYERS[package]
        for name in sorted(imported):
            if name.split(".")[0] in STAGES:
                found.append(f"{path}: imports {name}, outside the featureline namespace")
                continue
            target = layer_of(name)
            if target is None or target == package or layer == 2:
                continue
            relative = name.removeprefix("featureline.")
            if LAYERS[target] > layer:
                found.append(f"{path}: imports {relative}, a higher layer ({target})")
            elif LAYERS[target] == layer and relative not in PUBLIC.get(package, set()):
                found.append(f"{path}: imports {relative}, inside another stage ({target})")
        if package in ("core", "api") and any(n.split(".")[0] in SPARK for n in imported) and (
                path not in SPARK_HALVES or loads_spark(REPO / path)):
            found.append(f"{path}: imports Spark")
    return sorted(set(found))


def loads_spark(path: Path) -> bool:
    """Whether loading the module imports Spark: an import outside any function and outside
    an ``if TYPE_CHECKING:`` block."""
    def run_at_load(node: ast.AST) -> list[str]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) or (
                isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            return []
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        if isinstance(node, ast.ImportFrom):
            return [node.module or ""]
        return [name for child in ast.iter_child_nodes(node) for name in run_at_load(child)]

    names = run_at_load(ast.parse(path.read_text(), str(path)))
    return any(name.split(".")[0] in SPARK for name in names)


def test_no_module_imports_a_higher_layer_or_another_stages_internals():
    assert violations(import_graph()) == []


@pytest.mark.parametrize(("module", "path", "imported", "message"), [
    ("core.metadata", "core/metadata.py", {"featureline.etl.config"}, "a higher layer (etl)"),
    ("etl.job", "etl/job.py", {"featureline.cli"}, "a higher layer (featureline)"),
    ("api.services", "api/services.py", {"featureline.hps.volatile"},
     "inside another stage (hps)"),
    ("hps.server", "hps/server.py", {"featureline.feature_store.repo"}, "inside another stage"),
    ("api.vocabulary", "api/vocabulary.py", {"pyspark.sql"}, "imports Spark"),
    ("cli", "featureline/cli.py", {"etl.job"}, "outside the featureline namespace"),
])
def test_the_check_finds_each_kind_of_violation(module, path, imported, message):
    graph = {module: (path, imported)}
    (found,) = violations(graph)
    assert message in found and path in found


def test_a_spark_half_imports_spark_only_when_called(tmp_path):
    module = tmp_path / "operations.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from pyspark.sql import Column\n"
                      "def _spark():\n    from pyspark.sql import functions\n"
                      "    return functions\n")
    assert not loads_spark(module)
    module.write_text("import math\nfrom pyspark.sql import functions\n")
    assert loads_spark(module)
    module.write_text("class A:\n    def f(self):\n        pass\n    import pyspark\n")
    assert loads_spark(module)


def operation_dispatches(path: Path) -> list[str]:
    """Where a module tells operations apart: its ``op`` compared with an operation's name,
    ``OPERATIONS`` indexed by one, or an operation's class imported (docs/ARCHITECTURE.md,
    "Operations"). A spec that uses an operation (``op="count"``) is not one."""
    import featureline.core.operations as operations

    names = set(operations.OPERATIONS)
    classes = {op.__name__ for op in operations.OPERATIONS.values()}
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Attribute) and o.attr == "op" for o in operands):
                found += [f"{node.lineno}: compares op with {c.value!r}" for o in operands
                          for c in ast.walk(o) if isinstance(c, ast.Constant)
                          and c.value in names]
        elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
              and node.value.id == "OPERATIONS" and isinstance(node.slice, ast.Constant)):
            found.append(f"{node.lineno}: OPERATIONS[{node.slice.value!r}]")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "featureline.core.operations"):
            found += [f"{node.lineno}: imports {alias.name}" for alias in node.names
                      if alias.name in classes]
    return found


def test_no_module_outside_the_operations_tells_operations_apart():
    """Executors, configuration and features read an operation's flags and methods only."""
    found = {str(path.relative_to(REPO)): dispatches for package in LAYERS
             for path in sorted((REPO / package).rglob("*.py"))
             if "operations" not in path.relative_to(REPO).parts
             and (dispatches := operation_dispatches(path))}
    assert found == {}


def test_the_operations_check_finds_each_kind_of_dispatch(tmp_path):
    module = tmp_path / "executor.py"
    module.write_text("from featureline.core.operations import ApproxDistinct, Operation\n"
                      "def f(spec, kind):\n"
                      "    if spec.op in ('last', 'last_k') or kind == 'count':\n"
                      "        return OPERATIONS['mean']\n"
                      "    spec = dict(op='count')\n")
    assert operation_dispatches(module) == [
        "1: imports ApproxDistinct", "3: compares op with 'last'",
        "3: compares op with 'last_k'", "4: OPERATIONS['mean']"]


def test_the_serving_processes_never_load_pyspark():
    """The API app, its uvicorn factory and Feast's definitions file run without Spark."""
    code = ("import sys, featureline.api.app, featureline.serving; "
            "from featureline.serving import load_serving_config; "
            "load_serving_config('featureline.yaml'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark' "
            "or m.startswith('featureline.etl')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO, timeout=120, check=True)
    assert result.stdout.strip() == "[]"


def environment_variables_read() -> set[str]:
    """Every environment variable the package's code reads (or defaults), by its name."""
    patterns = [r'\b[A-Z_]*ENV\w* = "([A-Z][A-Z0-9_]+)"',
                r'environ(?:\.get|\.setdefault|\.pop)?\(\s*"([A-Z][A-Z0-9_]+)"',
                r'environ\["([A-Z][A-Z0-9_]+)"\]', r'getenv\(\s*"([A-Z][A-Z0-9_]+)"']
    names: set[str] = set()
    for package in LAYERS:
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text()
            for pattern in patterns:
                names.update(re.findall(pattern, text))
    return names


def test_the_architecture_lists_every_environment_variable_the_code_reads():
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    section = text[text.index("### Configuration"):text.index("## Where new things go")]
    listed = {name for row in section.splitlines() if row.startswith("| `")
              for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row.split("|")[1])}
    assert "REDIS_URL" in environment_variables_read()
    assert environment_variables_read() == listed


def test_every_section_the_code_cites_is_in_the_architecture():
    """Every section of docs/ARCHITECTURE.md that a comment or docstring cites (the file,
    a comma, the section's name in quotes) is one of its headings: a renamed or merged section
    leaves no citation pointing nowhere."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    headings = {match.strip() for match in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}
    cited: dict[str, str] = {}
    for folder in [*LAYERS, "tests", "benchmarks", "scripts"]:
        for path in (REPO / folder).rglob("*.py"):
            for name in re.findall(r'ARCHITECTURE\.md,\s*(?:#\s*)?"([^"]+)"', path.read_text()):
                # A name wrapped across comment lines: its words without the "#".
                cited[" ".join(name.replace("#", " ").split())] = path.name
    assert len(cited) > 20
    assert {name: where for name, where in cited.items() if name not in headings} == {}


def test_the_parameter_server_reaches_its_tiers_through_their_interfaces():
    """Stores and caches are chosen by the registries in their own modules (``type:``)."""
    concrete = {"RocksDBStore", "HashMapStore", "RedisStore", "HostCache", "GpuCache"}
    for name in ("server.py", "reload.py", "repair.py", "table.py"):
        source = (REPO / "hps" / name).read_text()
        named = {word for word in re.findall(r"\b[A-Z]\w+", source) if word in concrete}
        assert named == set(), (name, named)
        assert "isinstance" not in source, name
    assert len((REPO / "hps" / "server.py").read_text().splitlines()) <= 350


# The Redis client libraries, and the modules of the online side allowed to use them: the
# online store's Redis backend, and the embedded server's manager.
REDIS_CLIENTS = ("redis", "hiredis")
REDIS_MODULES = {"feature_store/redis_store.py", "feature_store/redis_server.py"}


def test_the_online_side_reaches_redis_only_through_the_online_store_backend():
    """The API, the reader and publish speak to the online store through its protocol
    (``feature_store/online_store.py``); only the backend imports a Redis client."""
    speaking = {path for path, imported in import_graph().values()
                if path.split("/")[0] in ("api", "feature_store")
                and any(name.split(".")[0] in REDIS_CLIENTS for name in imported)}
    assert speaking == REDIS_MODULES
    for path in (REPO / "api").rglob("*.py"):
        assert "redis_store" not in path.read_text(), path


def test_every_online_store_backend_implements_the_protocol():
    import inspect

    from featureline.feature_store.online_store import ONLINE_STORES, OnlineStore

    methods = {name: inspect.signature(member) for name, member in vars(OnlineStore).items()
               if inspect.isfunction(member) and not name.startswith("_")}
    assert {"read_vectors", "write_view", "next_generation", "publication",
            "write_publication", "announce", "listen"} <= set(methods)
    for kind, backend in ONLINE_STORES.items():
        for name, signature in methods.items():
            assert inspect.signature(getattr(backend, name)) == signature, (kind, name)
