"""spark-submit entry point: the same job and flags as ``featureline etl run``.

    spark-submit --properties-file spark_conf/cpu.conf etl/main.py --input data/raw/events.jsonl

spark-submit has already applied the properties file, so the profile file is not re-read.
"""

from __future__ import annotations

import sys

import click

from etl.cli import _run_job, job_options, summary
from etl.errors import FeaturelineError


@click.command()
@job_options
def submit(**options: str | None) -> None:
    """Run the ETL job inside spark-submit."""
    click.echo(summary(_run_job(**options, submitted=True)))  # type: ignore[arg-type]


if __name__ == "__main__":
    try:
        submit(standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except FeaturelineError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
