"""docs/files-as-they-come.md, run as a reader runs it (as tests/test_tutorial.py runs the
tutorial): MovieLens 100K's three RecBole files as they ship, through the ETL, publish,
training, serving, a ranking at a time of the log and the next day's run, with configuration
only. The API's port is swapped for a free one; the rest runs as written."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_tutorial import blocks

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
    from featureline.feature_store.redis_server import EmbeddedRedis, free_port
    from featureline.feature_store.repo import copy_packaged_repo

    page = PAGE.read_text()
    port = str(free_port())
    for info, body in blocks(page, "yaml"):
        (name,) = re.findall(r'title="([^"]+)"', info)
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body.replace(PORT, port))
    copy_packaged_repo(tmp_path / "feature_store" / "feast_repo")
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    script = "\n".join(["set -euo pipefail",
                        *(body.replace(PORT, port) for _, body in blocks(page, "bash"))])
    with EmbeddedRedis(tmp_path / "redis") as redis:
        env = {**os.environ, "REDIS_URL": redis.url}
        try:
            done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=1500)
        finally:
            pid_file = tmp_path / "data" / "files" / "api.pid"
            if pid_file.is_file():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid_file.read_text()), signal.SIGTERM)
    output = done.stdout + done.stderr
    (tmp_path / "page.log").write_text(output)
    assert done.returncode == 0, output[-4000:]
    assert "ok: data/files/history.inter (csv)" in done.stdout  # etl check
    assert "rows: read 99,464 = accepted 99,464 + duplicates 0 + quarantined 0" in done.stdout
    assert "release_year_token_cat" in done.stdout and "occupation_token_cat" in done.stdout
    assert re.search(r'"items":\[\{"item_id":"(242|302|377)","score":0\.\d+', done.stdout)
    assert '"rater_year:count_30d"' in done.stdout
    # The next day: its 536 ratings (the output's rows now 100,000: every rating), the gate
    # passing against the first run's days.
    assert "rows: read 100,000 = accepted 100,000 + duplicates 0" in done.stdout
    assert "split: train 99,464, valid 536" in done.stdout
    assert re.search(r"checks: PASSED against \S*data/files/output\n", done.stdout)
