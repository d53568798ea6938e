"""How the job's stages are named and tagged: one definition for the job, the progress lines,
metadata.json's timings and both GPU checks; no Spark import, so the checks read logs
without it.
"""

from __future__ import annotations

from typing import Literal, get_args

# The raw log formats the job reads (etl.source.format, --format, datagen's formats).
InputFormat = Literal["jsonl", "csv", "parquet"]
INPUT_FORMATS: tuple[str, ...] = get_args(InputFormat)

# The job's stages, in the order it runs them (etl/job.py).
JOB_STAGES = ("ingest", "split", "features", "write_examples", "write_tfrecord", "entities",
              "artifacts", "profile", "state")
(INGEST, SPLIT, FEATURES, WRITE_EXAMPLES, WRITE_TFRECORD, ENTITIES, ARTIFACTS, PROFILE,
 STATE) = JOB_STAGES
# The local property naming the stage each Spark job runs for (in the event log).
STAGE_PROPERTY = "featureline.stage"
# The driver-side logger StageTimer names each stage to as it starts ("" as it ends).
STAGE_LOGGER = "featureline.stage"
# Spark work outside any stage of ours.
UNTAGGED = "other"
