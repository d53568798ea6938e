"""Tools fetched on first use into a cache outside the repository, staged and published whole
(``core.files.fetched_once``), then reused: NVIDIA's Qualification tool and the Spark 3.5 jars
it runs on (from PyPI, for ``featureline etl qualify``), and the RAPIDS Accelerator jar the
project pins (from Maven Central, for ``featureline etl gpu-check``), and Apache Kafka's
release jars (from Maven Central, for ``featureline kafka start`` and the tests' broker),
a real public ratings log for the trainer's benchmark (MovieLens 100K, as the RecBole
package on PyPI ships it), and Prometheus' promtool (from Debian, for the alert rules'
tests); and, made rather than fetched, the archive of Spark's classes local sessions start
from (``etl.class_archive``). Developer tooling: the ETL and the services never fetch
anything.

:func:`fetch_all` fetches every one at once, in parallel (``featureline fetch``; ``make
test`` runs it beside the linters, so that no test waits on a download).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from featureline.core.errors import FeaturelineError
from featureline.core.files import CACHE_ENV, cache_root, fetched_once
from featureline.etl.class_archive import class_archive
from featureline.etl.errors import PluginFetchError
from featureline.etl.qualification import (
    SPARK_JARS_VERSION,
    TOOLS_VERSION,
    QualificationError,
)
from featureline.etl.rapids import CUDA_CLASSIFIER, JAR_NAME, MAVEN_ARTIFACT, RAPIDS_VERSION
from featureline.stream.errors import KafkaFetchError

__all__ = ["CACHE_ENV", "cache_root", "fetch_all"]


def plugin_jar() -> Path:
    """The pinned plugin jar: fetched into the cache the first time, then reused."""
    root = cache_root() / f"rapids-plugin-{RAPIDS_VERSION}-{CUDA_CLASSIFIER}"
    return fetched_once(root, JAR_NAME, _fetch_plugin) / JAR_NAME


def _fetch_plugin(folder: Path) -> None:
    """``mvn dependency:copy`` of the jar into ``folder``, with a Maven repository of its own
    inside the staging folder (removed after), so the cache holds one copy of ~1 GB."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise PluginFetchError(f"cannot fetch {MAVEN_ARTIFACT}: mvn is not on PATH")
    repository = folder / "maven-repository"
    done = subprocess.run(
        [mvn, "--batch-mode", "--quiet", "dependency:copy", f"-Dartifact={MAVEN_ARTIFACT}",
         f"-DoutputDirectory={folder}", f"-Dmaven.repo.local={repository}"],
        capture_output=True, text=True, check=False, cwd=folder)
    shutil.rmtree(repository, ignore_errors=True)
    if done.returncode != 0 or not (folder / JAR_NAME).is_file():
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise PluginFetchError(f"cannot fetch {MAVEN_ARTIFACT} from Maven Central: "
                               f"{' '.join(tail) or done.returncode}")


# Apache Kafka's broker (KRaft mode) from its release jars on Maven Central.
KAFKA_VERSION = "4.1.1"
KAFKA_ARTIFACT = f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}"
# A project whose dependencies are the broker's: `mvn dependency:copy-dependencies` fetches
# the jar and everything it runs with (scala, the raft and storage modules, logging).
KAFKA_POM = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>featureline</groupId><artifactId>kafka-broker</artifactId><version>1</version>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{KAFKA_VERSION}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId>
      <version>2.24.3</version>
    </dependency>
  </dependencies>
</project>
"""


def kafka_classpath() -> str:
    """The Java class path of the pinned Kafka broker: fetched into the cache the first time,
    then reused."""
    root = fetched_once(cache_root() / f"kafka-{KAFKA_VERSION}", "READY", _fetch_kafka)
    return f"{root / 'libs'}{os.sep}*"


def _fetch_kafka(folder: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaFetchError(f"cannot fetch {KAFKA_ARTIFACT}: mvn is not on PATH")
    (folder / "pom.xml").write_text(KAFKA_POM)
    repository = folder / "maven-repository"
    done = subprocess.run(
        [mvn, "--batch-mode", "--quiet", "dependency:copy-dependencies",
         "-DincludeScope=runtime", f"-DoutputDirectory={folder / 'libs'}",
         f"-Dmaven.repo.local={repository}"],
        capture_output=True, text=True, check=False, cwd=folder)
    shutil.rmtree(repository, ignore_errors=True)
    if done.returncode != 0 or not list((folder / "libs").glob("kafka_2.13-*.jar")):
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise KafkaFetchError(f"cannot fetch {KAFKA_ARTIFACT} from Maven Central: "
                             f"{' '.join(tail) or done.returncode}")
    (folder / "READY").write_text(KAFKA_ARTIFACT)


def _pip_download(requirement: str, into: Path, *extra: str,
                  error: type[FeaturelineError] = QualificationError) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               "--disable-pip-version-check", "-d", str(into), *extra, requirement]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise error(f"cannot fetch {requirement} from the package registry: "
                    f"{done.stderr.strip().splitlines()[-1:] or done.returncode}")
    return next(into.iterdir())


class DatasetFetchError(FeaturelineError):
    """A public dataset could not be fetched or read."""


# MovieLens 100K (GroupLens; its licence allows research use, not redistribution: it is
# fetched from the package that ships it, never copied into this repository).
MOVIELENS_PACKAGE = "recbole==1.2.1"
MOVIELENS_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"
MOVIELENS_FILE = "ratings.jsonl"


def movielens_100k() -> Path:
    """MovieLens 100K as a raw log of ours (one JSON line per rating: ``user_id`` u<id>,
    ``item_id`` i<id>, ``event_type`` rating, ``ts`` epoch seconds, ``value`` the 1–5
    rating): fetched into the cache the first time, then reused."""
    root = cache_root() / f"movielens-100k-{MOVIELENS_PACKAGE.replace('==', '-')}"
    return fetched_once(root, MOVIELENS_FILE, _fetch_movielens) / MOVIELENS_FILE


def _fetch_movielens(folder: Path) -> None:
    wheel = _pip_download(MOVIELENS_PACKAGE, folder / "downloads", error=DatasetFetchError)
    with zipfile.ZipFile(wheel) as archive:
        if MOVIELENS_MEMBER not in archive.namelist():
            raise DatasetFetchError(f"{wheel.name} holds no {MOVIELENS_MEMBER}")
        lines = archive.read(MOVIELENS_MEMBER).decode().splitlines()
    with (folder / MOVIELENS_FILE).open("w") as out:
        for line in lines[1:]:  # user_id:token, item_id:token, rating:float, timestamp:float
            user, item, rating, ts = line.split("\t")
            out.write(json.dumps({"user_id": f"u{user}", "item_id": f"i{item}",
                                  "event_type": "rating", "ts": int(float(ts)),
                                  "value": float(rating)}) + "\n")
    shutil.rmtree(folder / "downloads")


# The RecBole files as they ship: tab-separated, ``name:type`` headers, the ratings without an
# event type, the movies' and the raters' attributes in their own files.
MOVIELENS_FILES = ("ml-100k.inter", "ml-100k.item", "ml-100k.user")


def movielens_100k_files() -> Path:
    """The folder of MovieLens 100K's three RecBole files, byte for byte as the package ships
    them (the guide's "Files as they come" reads them): fetched into the cache the first time."""
    root = cache_root() / f"movielens-100k-files-{MOVIELENS_PACKAGE.replace('==', '-')}"
    return fetched_once(root, MOVIELENS_FILES[-1], _fetch_movielens_files)


def _fetch_movielens_files(folder: Path) -> None:
    wheel = _pip_download(MOVIELENS_PACKAGE, folder / "downloads", error=DatasetFetchError)
    with zipfile.ZipFile(wheel) as archive:
        for name in MOVIELENS_FILES:
            member = str(Path(MOVIELENS_MEMBER).with_name(name))
            if member not in archive.namelist():
                raise DatasetFetchError(f"{wheel.name} holds no {member}")
            (folder / name).write_bytes(archive.read(member))
    shutil.rmtree(folder / "downloads")


def qualification_classpath() -> str:
    """The Java class path of NVIDIA's Qualification tool: fetched into the cache the first
    time, then reused."""
    root = fetched_once(cache_root() / f"qualification-{TOOLS_VERSION}-spark-{SPARK_JARS_VERSION}",
                        "READY", _fetch_qualification)
    jar = next((root / "tools").glob("rapids-4-spark-tools_*.jar"))
    return f"{jar}{os.pathsep}{root / 'spark-jars'}{os.sep}*"


def _fetch_qualification(folder: Path) -> None:
    downloads = folder / "downloads"
    wheel = _pip_download(f"spark-rapids-user-tools=={TOOLS_VERSION}", downloads / "tools")
    with zipfile.ZipFile(wheel) as archive:
        member = next((name for name in archive.namelist()
                       if re.search(r"core/jars/rapids-4-spark-tools_[^/]+\.jar$", name)), None)
        if member is None:
            raise QualificationError(f"{wheel.name} holds no rapids-4-spark-tools jar")
        (folder / "tools").mkdir()
        (folder / "tools" / Path(member).name).write_bytes(archive.read(member))
    sdist = _pip_download(f"pyspark=={SPARK_JARS_VERSION}", downloads / "spark",
                          "--no-binary", ":all:")
    (folder / "spark-jars").mkdir()
    with tarfile.open(sdist) as archive:
        for entry in archive.getmembers():
            if entry.isfile() and re.search(r"/deps/jars/[^/]+\.jar$", entry.name):
                source = archive.extractfile(entry)
                assert source is not None
                (folder / "spark-jars" / Path(entry.name).name).write_bytes(source.read())
    shutil.rmtree(downloads)
    (folder / "READY").write_text(json.dumps({"tools": TOOLS_VERSION,
                                              "spark_jars": SPARK_JARS_VERSION}))


class PromtoolFetchError(FeaturelineError):
    """promtool could not be fetched from Debian's packages."""

    hint = "install Prometheus' promtool, or run on Debian with apt-get and dpkg-deb"


# Debian's build of Prometheus 2.42 ships promtool; fetched with apt-get download (no root).
PROMETHEUS_DEB = "prometheus=2.42.0+ds-5+deb12u1"


def promtool() -> Path:
    """promtool: the one on PATH, else Debian's, fetched into the cache the first time."""
    found = shutil.which("promtool")
    if found:
        return Path(found)
    root = fetched_once(cache_root() / "promtool-2.42.0", "usr/bin/promtool", _fetch_promtool)
    return root / "usr" / "bin" / "promtool"


def _fetch_promtool(folder: Path) -> None:
    if not (shutil.which("apt-get") and shutil.which("dpkg-deb")):
        raise PromtoolFetchError("promtool is not installed and this is no Debian machine "
                                 "to fetch it")
    fetched = subprocess.run(["apt-get", "download", PROMETHEUS_DEB], cwd=folder,
                             capture_output=True, text=True, timeout=300, check=False)
    if fetched.returncode != 0:
        raise PromtoolFetchError(f"cannot fetch {PROMETHEUS_DEB} from Debian: "
                                 f"{fetched.stderr.strip()[-300:]}")
    (deb,) = folder.glob("prometheus_*.deb")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(folder)], check=True, timeout=300)
    deb.unlink()


# Everything this module fetches, by the name ``featureline fetch`` prints.
FETCHES: dict[str, Callable[[], object]] = {
    "rapids-plugin": plugin_jar,
    "kafka": kafka_classpath,
    "qualification": qualification_classpath,
    "movielens-100k": movielens_100k,
    "movielens-100k-files": movielens_100k_files,
    "promtool": promtool,
    "spark-classes": class_archive,
}


def copy_fetched(name: str, into: Path) -> list[Path]:
    """Copy what ``name`` fetched into the folder ``into`` (its files, where it fetched a
    folder): the copies."""
    fetched = Path(str(FETCHES[name]()))
    into.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in fetched.iterdir() if p.is_file()) if fetched.is_dir() \
        else [fetched]
    return [Path(shutil.copy2(file, into / file.name)) for file in files]


def fetch_all(report: Callable[[str], None], names: list[str] | None = None) -> bool:
    """Fetch every tool (``names``: those) at once (a thread each: the time goes to the
    network and to mvn and pip), reporting each one's outcome and seconds; whether all were
    fetched."""
    started = time.perf_counter()

    def fetch(name: str) -> bool:
        begun = time.perf_counter()
        try:
            where = FETCHES[name]()
        except FeaturelineError as exc:
            report(f"{name}: not fetched ({exc})")
            return False
        report(f"{name}: {where} ({time.perf_counter() - begun:.1f}s)")
        return True

    chosen = names or list(FETCHES)
    with ThreadPoolExecutor(max_workers=len(chosen)) as pool:
        fetched = list(pool.map(fetch, chosen))
    report(f"fetched {sum(fetched)} of {len(fetched)} in {time.perf_counter() - started:.1f}s")
    return all(fetched)
