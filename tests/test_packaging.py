"""The package as users install it: one ``featureline`` import namespace over the repository's
folders (pyproject.toml's package-dir), built with ``python -m build`` into a wheel that installs
into a fresh virtual environment and runs ``featureline demo`` there, outside the checkout.

The fresh environment gets its third-party packages from the test environment's
site-packages (linked, without Featureline's own editable install), so that pip resolves the
wheel's declared dependencies against them with no index: nothing is downloaded, and a
dependency the wheel forgets to declare or that is not installed fails the install.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")

REPO = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
PACKAGE_DIR: dict[str, str] = SETUPTOOLS["package-dir"]
# Feast's definitions file runs at import: it describes an ETL output (Feast imports it).
NOT_IMPORTED = {"featureline.feature_store.feast_repo.featureline_repo"}
SOURCE_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc", "data")


def folder_packages() -> set[str]:
    """Every package the mapped folders hold: each folder with an ``__init__.py``."""
    found = set()
    for package, folder in PACKAGE_DIR.items():
        root = REPO / folder
        found.add(package)
        for init in root.rglob("__init__.py"):
            parts = init.parent.relative_to(root).parts
            found.add(".".join((package, *parts)))
    return found


def test_every_folder_is_mapped_into_the_one_namespace():
    packages = set(SETUPTOOLS["packages"])
    assert all(name == "featureline" or name.startswith("featureline.") for name in packages)
    assert folder_packages() <= packages
    # Data-only packages (the Feast repository, the Spark profiles) are listed on purpose.
    assert packages - folder_packages() == {"featureline.feature_store.feast_repo"}
    assert all((REPO / folder).is_dir() for folder in PACKAGE_DIR.values())


@pytest.mark.parametrize("dockerfile", sorted((REPO / "docker").glob("*.Dockerfile")),
                         ids=lambda p: p.name)
def test_the_images_build_the_wheel_from_every_mapped_folder(dockerfile):
    text = dockerfile.read_text()
    wheel_stage = text.split("FROM ", 2)[1]
    copied = set(re.findall(r"^COPY (\S+) \1$", wheel_stage, re.MULTILINE))
    assert set(PACKAGE_DIR.values()) <= copied


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``python -m build --wheel`` on a copy of what the package is made of."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for folder in PACKAGE_DIR.values():
        shutil.copytree(REPO / folder, src / folder, ignore=SOURCE_IGNORE)
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                    "--outdir", str(src / "dist"), str(src)],
                   check=True, capture_output=True, timeout=300)
    (built,) = (src / "dist").glob("featureline-*.whl")
    return built


def test_the_wheel_installs_one_package_with_its_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert top == {"featureline", next(n for n in top if n.endswith(".dist-info"))}
    for expected in ("featureline/cli.py", "featureline/py.typed", "featureline/etl/job.py",
                     "featureline/spark_conf/cpu.conf",
                     "featureline/feature_store/feast_repo/feature_store.yaml",
                     "featureline/feature_store/feast_repo/featureline_repo.py"):
        assert expected in names
    assert not [n for n in names if "/data/" in n or "__pycache__" in n or "/tests/" in n]
    entry_points = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "featureline = featureline.cli:run" in entry_points


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed; its bin folder."""
    root = tmp_path_factory.mktemp("wheel-venv")
    venv.create(root / "venv", with_pip=False)
    python = root / "venv" / "bin" / "python"
    deps = root / "deps"
    deps.mkdir()
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for entry in Path(site).iterdir():
            name = entry.name
            if (name.startswith(("__editable__", "featureline-", "__pycache__"))
                    or name.endswith(".pth") or (deps / name).exists()):
                continue
            (deps / name).symlink_to(entry)
    site_packages = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip()
    (Path(site_packages) / "_test_dependencies.pth").write_text(f"{deps}\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                    "--no-index", "--quiet", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    return python.parent


def clean_env(bin_dir: Path) -> dict[str, str]:
    """The environment of a user of the fresh venv: its Python for Spark's workers too."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "REDIS_URL")}
    python = str(bin_dir / "python")
    return {**env, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python,
            "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"}


def test_the_installed_package_imports_every_module_from_the_venv(installed, tmp_path):
    code = ("import importlib, pkgutil, featureline\n"
            f"skip = {sorted(NOT_IMPORTED)!r}\n"
            "names = [m.name for m in pkgutil.walk_packages(featureline.__path__, 'featureline.')"
            " if m.name not in skip]\n"
            "files = {importlib.import_module(n).__file__ for n in ['featureline', *names]}\n"
            "print(len(files)); print(*sorted(files), sep='\\n')\n")
    result = subprocess.run([installed / "python", "-c", code], cwd=tmp_path, check=True,
                            capture_output=True, text=True, env=clean_env(installed),
                            timeout=300)
    count, *files = result.stdout.split("\n")[:-1]
    sources = sum(len(list((REPO / folder).rglob("*.py"))) for folder in PACKAGE_DIR.values())
    assert int(count) == len(files) == sources - len(NOT_IMPORTED)
    venv_root = str(installed.parent)
    assert all(f.startswith(venv_root) for f in files), files[:3]


@pytest.mark.slow
def test_the_installed_wheel_runs_the_demo_outside_the_checkout(installed, tmp_path):
    """``featureline demo`` from the fresh venv in an empty folder: the whole pipeline, the
    packaged Spark profile and Feast repository, the API started as the venv's module."""
    env = clean_env(installed)
    featureline = str(installed / "featureline")
    try:
        result = subprocess.run([featureline, "demo", "--out", "d", "--events", "2000"],
                                cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=600)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-3000:]
        assert f"using a copy of the package's, {tmp_path / 'd' / 'feast_repo'}" in output
        assert "rows: read 2,000 = accepted" in output and "demo finished" in output
        answers = [line for line in output.splitlines() if line.startswith("  → ")]
        # Every endpoint, /v1/rank where the trained model was exported (TensorFlow), then
        # the push.
        scored = (tmp_path / "d" / "hps" / "dense.json").is_file()
        assert len(answers) == (11 if scored else 10)
        assert all(a.startswith("  → 200") for a in answers[:-1])
        assert answers[-1].startswith("  → 202") and "fresh features of" in output
        assert "Traceback" not in output
        assert (tmp_path / "d" / "hps" / "hps.yaml").is_file()
        assert not (REPO / "d").exists()
    finally:
        pid_file = tmp_path / "d" / "api.pid"
        if pid_file.is_file():
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        subprocess.run([featureline, "redis", "stop"], cwd=tmp_path, env=env,
                       capture_output=True, timeout=60)
