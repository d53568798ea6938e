"""spark-submit entry point: the same job and flags as ``featureline etl run``.

    spark-submit --properties-file spark_conf/cpu.conf etl/main.py --input data/raw/events.jsonl

spark-submit has already applied the properties file, so the profile file is not re-read.
"""

from __future__ import annotations

import click

from featureline.cli import run_command
from featureline.etl_runs import exit_if_refused, run_job, summary
from featureline.options import job_options


@click.command()
@job_options
def submit(**options: str | None) -> None:
    """Run the ETL job inside spark-submit; exit 1 when its newest day fails the validation
    gate."""
    run = run_job(**options, submitted=True)  # type: ignore[arg-type]
    click.echo(summary(run))
    exit_if_refused(run)


if __name__ == "__main__":
    run_command(submit)
