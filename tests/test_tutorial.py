"""docs/tutorial.md, run as a reader runs it: every YAML block with a title written to its
file, then every bash block in order in one shell (``set -euo pipefail``), in a fresh folder
holding a copy of the Feast repository, against a Redis server of its own. The commands come
from the page's own text, so the page cannot drift from what they do. The API's port is
swapped for a free one; the rest is run as written (real Spark, Feast, Redis, TensorFlow).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "tutorial.md"
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
PORT = "8010"


def blocks(text: str, language: str) -> list[tuple[str, str]]:
    """The page's code blocks of ``language``: (the fence's attributes, the text)."""
    return [(info, body) for lang, info, body in BLOCK.findall(text) if lang == language]


def test_the_page_has_its_steps():
    """What the run below executes: the files it writes and the commands it runs."""
    page = PAGE.read_text()
    (files,) = [re.findall(r'title="([^"]+)"', info) for info, _ in blocks(page, "yaml")]
    assert files == ["data/tutorial/shop.yaml"]
    (shop,) = [body for _, body in blocks(page, "yaml")]
    assert "\nderive:\n" in shop
    commands = "\n".join(body for _, body in blocks(page, "bash"))
    for step in ("featureline datagen", "featureline etl run", "featureline publish",
                 "featureline train", "featureline promote", "featureline serve",
                 "/v1/features", "/v1/ranking-inputs", "/v1/rank", "--incremental",
                 "/reload", "featureline lift"):
        assert step in commands, step


def run_page(page_path: Path, tmp_path: Path, port_text: str, pid_file: str
             ) -> subprocess.CompletedProcess[str]:
    """Every YAML block of a page with a title written to its file, then every bash block in
    order in one shell (``set -euo pipefail``), in ``tmp_path`` holding a copy of the Feast
    repository, against a Redis server of its own; the API's port ``port_text`` swapped for
    a free one, the server the page starts (``pid_file``) stopped after. Its output is in
    ``tmp_path / "page.log"``; a failed run fails the test."""
    from featureline.feature_store.redis_server import EmbeddedRedis, free_port
    from featureline.feature_store.repo import copy_packaged_repo

    page = page_path.read_text()
    port = str(free_port())
    for info, body in blocks(page, "yaml"):
        (name,) = re.findall(r'title="([^"]+)"', info)
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body.replace(port_text, port))
    copy_packaged_repo(tmp_path / "feature_store" / "feast_repo")
    script = "\n".join(["set -euo pipefail",
                        *(body.replace(port_text, port) for _, body in blocks(page, "bash"))])
    bin_dir = str(Path(sys.executable).parent)
    with EmbeddedRedis(tmp_path / "redis") as redis:
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               "REDIS_URL": redis.url}
        try:
            done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=1500)
        finally:
            pid = tmp_path / pid_file
            if pid.is_file():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid.read_text()), signal.SIGTERM)
    output = done.stdout + done.stderr
    (tmp_path / "page.log").write_text(output)
    assert done.returncode == 0, output[-4000:]
    return done


@pytest.mark.slow
def test_every_command_of_the_tutorial_runs(tmp_path):
    done = run_page(PAGE, tmp_path, PORT, "data/tutorial/api.pid")
    # What the page says the steps print.
    assert "checks: profile.json written" in done.stdout
    # The next day, against the days the first run kept.
    assert re.search(r"checks: PASSED against \S*data/tutorial/output\n", done.stdout)
    assert re.search(r"rows: read [\d,]+ = accepted", done.stdout)
    assert '"items":[{"item_id":' in done.stdout  # /v1/rank's answer
    # The lift of the derived feature and the count it reads.
    assert re.search(r"lift of category_cart_rate, visitor_category__carts_30d, "
                     r"category_cart_rate_missing \(3 seeds, [\d,]+ validation rows", done.stdout)
    assert '"model":"ranker","rows":' in done.stdout  # the reload's
    served = tmp_path / "data" / "tutorial" / "models" / "served"
    assert served.is_symlink() and (served / "hps.yaml").is_file()
    print(done.stdout[-3000:])
