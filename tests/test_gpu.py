"""The job under the RAPIDS Accelerator gives the CPU job's values.

Marked ``gpu``: skipped on machines without an NVIDIA GPU; it also needs RAPIDS_JAR (the
plugin jar is published on Maven only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.gpu
def test_gpu_profile_matches_cpu(small_log, job_output, tmp_path):
    if not os.environ.get("RAPIDS_JAR"):
        pytest.skip("RAPIDS_JAR is not set")
    out = tmp_path / "gpu"
    result = subprocess.run(
        [str(Path(sys.executable).parent / "featureline"), "etl", "run", "--profile", "gpu",
         "--input", str(small_log), "--output", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["rows"] == job_output.metadata["rows"]
    keys = ["user_id", "item_id", "ts"]
    gpu = pq.read_table(out / "examples").to_pandas().sort_values(keys).reset_index(drop=True)
    cpu = (pq.read_table(job_output.output / "examples").to_pandas().sort_values(keys)
           .reset_index(drop=True))
    for feature in metadata["features"]:
        name = feature["name"]
        if feature["kind"] == "continuous":
            assert gpu[name].to_numpy() == pytest.approx(cpu[name].to_numpy(), rel=1e-5)
        else:
            assert gpu[name].tolist() == cpu[name].tolist()
