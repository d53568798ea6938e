"""The user guide: it builds strictly (a broken link fails), its generated references cover
every key and endpoint, the README stays a front door, and two pages render in a real
headless Chromium without console errors and without asking any outside host."""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from featureline.docs import api_reference, configuration_reference, keys, site_markdown
from tests.browser import headless_page, needs_chromium

REPO = Path(__file__).resolve().parent.parent
MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict"]  # not --quiet: it hides
# the warnings that strict mode counts


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([*MKDOCS, "--config-file", str(config), "--site-dir", str(site)],
                          capture_output=True, text=True, env=env, cwd=config.parent,
                          timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The guide as `make docs` builds it (strict)."""
    site = tmp_path_factory.mktemp("site")
    built = _build(REPO / "mkdocs.yml", site)
    assert built.returncode == 0, built.stderr
    return site


def _nav_pages(entries: list[Any]) -> Iterator[str]:
    """Every page of the guide's navigation (mkdocs.yml's nav), in order."""
    for entry in entries:
        for value in entry.values():
            yield from _nav_pages(value) if isinstance(value, list) else [value]


def test_the_guide_builds_strictly_with_every_page(site):
    listed = list(_nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]))
    for page in listed:
        assert (site / page.replace(".md", ".html")).is_file(), page
    # Every Markdown file of docs/ is in the navigation (strict fails on one left out too).
    written = {str(path.relative_to(REPO / "docs")) for path in (REPO / "docs").rglob("*.md")}
    assert written <= set(listed), written - set(listed)
    home = (site / "index.html").read_text()
    assert "Two commands" in home and 'href="etl.html"' in home  # the README, its links relinked
    assert "The test suite" in (site / "benchmarks.html").read_text()


def test_a_broken_link_fails_the_build(tmp_path):
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path)
    shutil.copytree(REPO / "scripts", tmp_path / "scripts")
    for name in ("README.md", "benchmarks/README.md"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    page = tmp_path / "docs" / "notebooks.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    built = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    assert "no-such-page.md" in built.stderr + built.stdout


def _yaml_keys(value: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(value, dict):
        for key, inner in value.items():
            path = f"{prefix}{key}"
            yield path
            # Maps of names, not keys of the file.
            if not path.endswith(("properties", "transforms", "tables", "roles", "options")):
                yield from _yaml_keys(inner, f"{path}.")
    elif isinstance(value, list):
        for item in value:
            yield from _yaml_keys(item, prefix.removesuffix(".") + "[].")


def test_every_key_of_featureline_yaml_is_in_the_configuration_reference():
    reference = configuration_reference()
    in_file = sorted(set(_yaml_keys(yaml.safe_load((REPO / "featureline.yaml").read_text()))))
    assert "etl.features[].freq_threshold" in in_file and "api.auth.keys_file" in in_file
    missing = [key for key in in_file if f"`{key}`" not in reference]
    assert not missing, missing
    # The commented aggregation example, and the parameter server's file, are there too.
    for key in ("aggregations[].features[].windows", "hps.models[].tables[].dim",
                "hps.volatile_db.type", "stream.read_batch"):
        assert f"`{key}`" in reference, key


def test_the_configuration_reference_holds_every_key_of_the_settings_models():
    """Every key the models accept, the ops' and the parameter server's too (the ETL's copies
    of the top-level sections are written at the top level only)."""
    from featureline.config import SHARED_SECTIONS, FeaturelineConfig
    from featureline.etl.config import OP_SETTINGS
    from featureline.hps.config import HpsConfig

    reference = configuration_reference()
    copies = tuple(f"etl.{section}" for section in SHARED_SECTIONS)
    every = [key.path for key in keys(FeaturelineConfig) if not key.path.startswith(copies)]
    every += [key.path for op in OP_SETTINGS for key in keys(op, "etl.features[].")]
    every += [key.path for key in keys(HpsConfig, "hps.")]
    missing = [path for path in every if f"`{path}`" not in reference]
    assert not missing, missing
    for path in ("etl.validation.future_tolerance", "etl.fit.refit_every", "etl.model_ready",
                 "etl.attributes[].valid_from", "etl.source.options", "checks.closed",
                 "stream", "derive[].expr"):
        assert f"`{path}`" in reference, path


def test_every_key_has_its_comment_and_default():
    from featureline.config import FeaturelineConfig
    from featureline.hps.config import HpsConfig

    every = [*keys(FeaturelineConfig), *keys(HpsConfig, "hps.")]
    assert len(every) > 100
    uncommented = [key.path for key in every if not key.comment]
    assert not uncommented, f"fields without a comment above them: {uncommented}"
    by_path = {key.path: key for key in every}
    assert by_path["etl.tfrecord.prebatch_size"].default == "4096"
    assert by_path["feature_store.ttl"].default == '"30d"'
    assert by_path["etl.source.format"].type == '"jsonl" or "csv" or "parquet"'
    assert "Rows per tf.train.Example" in by_path["etl.tfrecord.prebatch_size"].comment


def test_the_api_reference_covers_every_operation_and_schema():
    from featureline.api.app import create_app

    openapi = create_app().openapi()
    reference = api_reference(openapi)
    for path, operations in openapi["paths"].items():
        for method in operations:
            assert f"`{method.upper()} {path}`" in reference, (method, path)
    for name in openapi["components"]["schemas"]:
        assert f"### {name}" in reference, name
    assert "| `entities` | map of string to array of string or integer | yes |" in reference


def test_repository_links_become_site_links():
    text = ("[ETL](docs/etl.md), [figures](benchmarks/README.md), "
            "[keys](featureline.yaml), [make](Makefile), [out](https://spark.apache.org), "
            "[here](#two-commands)")
    assert site_markdown(text) == ("[ETL](etl.md), [figures](benchmarks.md), "
                                   "[keys](reference/configuration.md), make, "
                                   "[out](https://spark.apache.org), [here](#two-commands)")
    # A guide page: its neighbours stay, the repository's files become the site's pages.
    page = ("[API](api.md#scoring), [figures](../benchmarks/README.md#the-test-suite), "
            "[schemas](../api/models.py), [home](../README.md), [k8s](../k8s/README.md)")
    assert site_markdown(page, "docs") == (
        "[API](api.md#scoring), [figures](benchmarks.md#the-test-suite), "
        "[schemas](reference/api.md), [home](index.md), k8s")


def test_every_link_works_on_github_too():
    """A relative link of the README or a guide page names a file of the repository (the
    site build checks the site's links strictly)."""
    import re

    broken = []
    for page in [REPO / "README.md", *(REPO / "docs").rglob("*.md")]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#")[0]
            if path and not target.startswith(("http://", "https://", "mailto:")) \
                    and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert broken == []


def test_the_readme_is_a_front_door():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "make demo" in readme and "make test" in readme
    # The figures a user plans with: a short table; every ratio says what it compares and
    # which way is better.
    figures = readme.split("## Current figures", 1)[1]
    rows = [line for line in figures.splitlines() if line.startswith("| ")][1:]
    assert 0 < len(rows) <= 15, len(rows)
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 3, row
        if "×" in row:
            assert cells[2].endswith(("(lower)", "(higher)")), row
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / target).is_file(), target


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_demo_transcripts_show_the_demos_steps_now(page):
    """The transcripts of ``make demo`` (scripts/demo_transcript.py writes the whole one)
    name the steps ``featureline demo`` prints today, in order: a step added or renamed
    fails here until the transcripts are made again."""
    code = (REPO / "featureline" / "cli.py").read_text()
    steps = re.findall(r'progress\(f"\[(\d)/\{steps\}\] ([^:"]+)', code)
    assert len(steps) >= 6
    shown = re.findall(r"^\[[\d:]+\] \[(\d)/(\d)\] ([^:\n]+)", (REPO / page).read_text(),
                       flags=re.MULTILINE)
    assert [(number, label) for number, _, label in shown] == steps
    assert {total for _, total, _ in shown} == {str(len(steps))}


def test_the_transcript_script_keeps_the_demos_lines_only(tmp_path):
    demo_transcript = _scripts_module("demo_transcript")
    log = "\n".join([
        ".venv/bin/featureline demo --out data/demo --events 200000",
        "[01:47:50] [1/6] datagen: 200,000 events",
        "WARNING: Using incubator modules: jdk.incubator.vector",
        "26/12/06 01:47:53 WARN NativeCodeLoader: Unable to load native-hadoop library",
        "[01:48:00] ingest: 5s, 1 Spark stage(s) running, tasks 0/2",
        "[01:48:07] ingest done in 11.6s: 182,461 rows read",
        f"checks: PASSED against {REPO}/data/demo/output"])
    assert demo_transcript.transcript(log).splitlines() == [
        "[01:47:50] [1/6] datagen: 200,000 events",
        "[01:48:07] ingest done in 11.6s: 182,461 rows read",
        "checks: PASSED against data/demo/output"]
    page = "intro\n<!-- demo transcript -->\n\n```\nold\nlines\n```\nafter\n"
    assert demo_transcript.splice(page, "new") == (
        "intro\n<!-- demo transcript -->\n\n```\nnew\n```\nafter\n")


def _scripts_module(name: str) -> Any:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(REPO / "scripts"))


PAGES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES)
def test_plain_sentences(page):
    """Each page's mean and 90th-percentile sentence length (prose only:
    scripts/sentence_lengths.py) within MAX_MEAN and MAX_P90 words."""
    lengths = _scripts_module("sentence_lengths")
    mean, p90 = lengths.summary(lengths.sentence_lengths((REPO / page).read_text()))
    print(f"{page}: mean {mean:.1f}, p90 {p90}")
    assert mean <= lengths.MAX_MEAN and p90 <= lengths.MAX_P90, (page, round(mean, 1), p90)


def test_sentences_are_counted_in_prose_only():
    lengths = _scripts_module("sentence_lengths")
    page = ("# A heading of many words that are not a sentence at all\n\n"
            "One two three. Four five `six seven eight` nine.\n\n"
            "```bash\nthis is code and not counted at all\n```\n\n"
            "| a | table | row |\n\n- An item here. [A link](x.md) ends it.\n")
    assert lengths.sentence_lengths(page) == [3, 4, 3, 4]
    assert lengths.summary([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) == (5.5, 9)


@pytest.fixture
def served(site) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@needs_chromium
def test_every_page_renders_in_headless_chromium(served, tmp_path):
    listed = list(_nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]))
    with headless_page(served) as visit:
        page = visit.page
        for name in listed:
            response = page.goto(f"{served}/{name.replace('.md', '.html')}",
                                 wait_until="networkidle")
            assert response is not None and response.status == 200, name
            assert page.locator("article h1").first.inner_text().strip("¶ \n"), name
        for name, heading in (("index", "Featureline"), ("etl", "The ETL job"),
                              ("tutorial", "Your data, end to end")):
            page.goto(f"{served}/{name}.html", wait_until="networkidle")
            assert page.locator("article h1").first.inner_text().strip("¶ \n") == heading
            shot = tmp_path / f"{name}.png"
            page.screenshot(path=str(shot))
            print(f"screenshot: {shot}")
        # The search (Material's own script, served locally) answers from the built index.
        page.locator("input.md-search__input").click()
        page.keyboard.type("quarantine")
        page.locator(".md-search-result__item").first.wait_for(timeout=10_000)
        assert "quarantine" in page.locator(".md-search-result").inner_text().lower()
    assert not visit.problems, visit.problems
    assert not visit.outside, visit.outside


def test_every_field_of_the_api_is_described():
    """Every property of every schema in the OpenAPI document has a description (FastAPI's
    own validation-error schemas aside): the contract a ranking service reads."""
    from featureline.api.app import create_app

    openapi = create_app().openapi()
    fastapis = {"HTTPValidationError", "ValidationError"}
    undescribed = [f"{name}.{field}" for name, schema in openapi["components"]["schemas"].items()
                   if name not in fastapis
                   for field, spec in schema.get("properties", {}).items()
                   if not spec.get("description")]
    assert len(openapi["components"]["schemas"]) > 15
    assert undescribed == []
