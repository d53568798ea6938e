"""docs/files-as-they-come.md, run as a reader runs it (as tests/test_tutorial.py runs the
tutorial): MovieLens 100K's three RecBole files as they ship, through the ETL, publish,
training, serving, a ranking at a time of the log and the next day's run, with configuration
only. The API's port is swapped for a free one; the rest runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_tutorial import blocks, run_page

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "files-as-they-come.md"
PORT = "8011"


def test_the_page_has_its_steps():
    page = PAGE.read_text()
    (files,) = [re.findall(r'title="([^"]+)"', info) for info, _ in blocks(page, "yaml")]
    assert files == ["data/files/movielens.yaml"]
    commands = "\n".join(body for _, body in blocks(page, "bash"))
    for step in ("featureline fetch movielens-100k-files", "featureline etl check",
                 "featureline etl run", "featureline publish", "featureline train",
                 "featureline serve", "/v1/rank", '"at": "1998-04-22', "--incremental"):
        assert step in commands, step
    # Configuration only: nothing rewrites the files' columns.
    assert "python" not in commands and "sed " not in commands


@pytest.mark.slow
def test_every_command_of_the_page_runs(tmp_path):
    done = run_page(PAGE, tmp_path, PORT, "data/files/api.pid")
    assert "ok: data/files/history.inter (csv)" in done.stdout  # etl check
    assert "rows: read 99,464 = accepted 99,464 + duplicates 0 + quarantined 0" in done.stdout
    assert "release_year_token_cat" in done.stdout and "occupation_token_cat" in done.stdout
    assert "class_token_seq_cat: 21 x" in done.stdout  # 19 genres, padding and OOV
    assert re.search(r'"items":\[\{"item_id":"(242|302|377)","score":0\.\d+', done.stdout)
    assert '"rater_year:count_30d"' in done.stdout
    # The next day: its 536 ratings (the output's rows now 100,000: every rating), the gate
    # passing against the first run's days.
    assert "rows: read 100,000 = accepted 100,000 + duplicates 0" in done.stdout
    assert "split: train 99,464, valid 536" in done.stdout
    assert re.search(r"checks: PASSED against \S*data/files/output\n", done.stdout)
