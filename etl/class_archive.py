"""Spark's classes archived for the driver JVM (Java's application class-data sharing): a
local session maps the ~18,000 classes a job loads from one file instead of reading and
verifying them from the jars, about a third less CPU to start (benchmarks/README.md).

The archive is made once per JVM and Spark installation (``featureline fetch``, which
``make test`` runs): the ETL job runs on a small generated log under spark-submit with
``-XX:ArchiveClassesAtExit`` and the file the JVM writes as it exits is published whole
into the cache (a partly written archive crashes the JVM that maps it). Sessions with a
local master use it when it is there; anything it does not hold (the RAPIDS jar, Spark's
generated code) loads as before, and a JVM that cannot use it ignores it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from featureline.core.files import cache_root, fetched_once
from featureline.etl.errors import ClassArchiveError

ARCHIVE = "spark.jsa"
_JAVA_OPTION = "-XX:SharedArchiveFile"
# For the processes of one small job each (the test suite sets it in SPARK_SUBMIT_OPTS, which
# every spark-submit and pyspark driver reads): the JIT's first tier alone. A job of a few
# thousand rows spends much of its driver's CPU compiling code with the second tier (C2)
# that then runs too little to repay it; a large job, or a session running many, needs C2
# (benchmarks/README.md). The first tier alone gets a 48 MB code cache by default, which a
# job with the RAPIDS jar fills (the JVM then stops compiling): hence the tiered default's.
SMALL_JOBS_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


def _java() -> Path | None:
    """The ``java`` spark-submit starts: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def _spark_jars() -> Path:
    import pyspark

    # Resolved as pyspark finds its own home: a venv that links another's pyspark (an
    # installed wheel's over the same site-packages) runs the same class path.
    return Path(pyspark.__file__).resolve().parent / "jars"


def archive_folder() -> Path | None:
    """The cache folder of the archive for this JVM and this Spark (None without a java).

    Its name hashes what the archive depends on: the JVM's build (its module image) and the
    class path spark-submit puts together (the pyspark jars' folder and version)."""
    java = _java()
    if java is None:
        return None
    modules = java.parent.parent / "lib" / "modules"
    jars = _spark_jars()
    identity = [str(java), str(jars)]
    for path in (modules, jars):
        stat = path.stat() if path.exists() else None
        identity.append(f"{stat.st_size}:{stat.st_mtime_ns}" if stat else "missing")
    digest = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]
    return cache_root() / f"spark-classes-{digest}"


def driver_java_options(properties: dict[str, str]) -> str | None:
    """``spark.driver.extraJavaOptions`` with the archive added, for a session of these
    properties: None where it does not apply (a cluster's driver, no archive yet)."""
    if not properties.get("spark.master", "local").startswith("local"):
        return None
    folder = archive_folder()
    if folder is None or not (folder / ARCHIVE).is_file():
        return None
    current = properties.get("spark.driver.extraJavaOptions", "")
    if _JAVA_OPTION in current:
        return None
    return f"{current} {_JAVA_OPTION}={folder / ARCHIVE}".strip()


def class_archive() -> Path:
    """The archive of this JVM and Spark: made into the cache the first time, then reused."""
    folder = archive_folder()
    if folder is None:
        raise ClassArchiveError("no java found (JAVA_HOME or PATH) to archive Spark's classes")
    return fetched_once(folder, ARCHIVE, _make_archive) / ARCHIVE


def _make_archive(folder: Path) -> None:
    """The ETL job on 2,000 generated events under spark-submit: the classes its driver
    loaded are written to ``folder`` when the JVM exits (before ``subprocess.run`` returns)."""
    from featureline.etl.datagen import write_log
    from featureline.etl.session import spark_conf_dir

    work = folder / "work"
    write_log(work / "events.jsonl", events=2000, users=50, items=40, days=3, seed=1,
              bad_fraction=0.01)
    submit = Path(sys.executable).parent / "spark-submit"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"))
    done = subprocess.run(
        [str(submit if submit.exists() else "spark-submit"),
         "--properties-file", str(spark_conf_dir() / "cpu.conf"), "--master", "local[2]",
         "--driver-java-options", f"-XX:ArchiveClassesAtExit={folder / ARCHIVE}",
         str(Path(__file__).with_name("main.py")), "--input", str(work / "events.jsonl"),
         "--output", str(work / "output")],
        capture_output=True, text=True, env=env, cwd=work, timeout=900, check=False)
    shutil.rmtree(work, ignore_errors=True)
    if done.returncode != 0 or not (folder / ARCHIVE).is_file():
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise ClassArchiveError("the JVM wrote no class archive: "
                                f"{' '.join(tail) or done.returncode}")
