"""Options several commands share: the configuration file, the ETL output, the ETL job's
flags (``etl run``, ``etl qualify``, ``etl gpu-check``, spark-submit's ``etl/main.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from featureline.etl.stages import INPUT_FORMATS
from featureline.serving import DEFAULT_CONFIG

# A command's function, before or after click's decorators.
Command = TypeVar("Command", bound=Callable[..., Any])

config_option = click.option("--config", "path", type=click.Path(dir_okay=False),
                             help=f"YAML configuration (default: ./{DEFAULT_CONFIG} if present)")
data_option = click.option("--data", type=click.Path(file_okay=False),
                           help="ETL output folder with metadata.json (default: etl.output.path)")
output_option = click.option("--output", help="Output folder (overrides output.path)")
profile_option = click.option("--profile", type=click.Choice(["cpu", "gpu", "k8s-cpu", "k8s-gpu"]),
                              help="Spark profile: spark_conf/<profile>.conf")


def job_options(command: Command) -> Command:
    options = [
        config_option,
        click.option("--input", "input_path",
                     help="Raw log path or glob (overrides source.path); {yesterday} and "
                          "{today} stand for those UTC dates"),
        click.option("--format", "input_format", type=click.Choice(INPUT_FORMATS),
                     help="Raw log format (default: from the file suffix)"),
        output_option,
        profile_option,
        click.option("--label", help="Label rule, e.g. 'value >= 4' or "
                                     "'event_type in (click, purchase)'"),
        click.option("--categorical", help="Categorical context columns, comma-separated"),
        click.option("--continuous", help="Continuous context columns, comma-separated"),
        click.option("--vocabulary-from", type=click.Path(file_okay=False),
                     help="ETL output whose vocabularies this run extends (default: the "
                          "output folder's current publication)"),
        click.option("--fit-from", type=click.Path(file_okay=False),
                     help="ETL output whose fit (encodings, normalisation, standardisation) "
                          "this run transforms with, none recomputed; its vocabularies are "
                          "extended (etl.fit.from_output)"),
        click.option("--refit", is_flag=True,
                     help="Fit the statistics anew this run, whatever etl.fit.refit_every "
                          "says (etl.fit.refit)"),
        click.option("--valid-days", type=click.IntRange(min=1),
                     help="Days at the end of the log that form the validation split "
                          "(overrides split.valid_days)"),
        click.option("--incremental", is_flag=True,
                     help="Extend the output with the new raw files of --input only, from the "
                          "state the last run left in it (etl.mode: incremental)"),
        click.option("--refit-vocabularies", is_flag=True,
                     help="Assign every id afresh: a new lineage, incompatible with earlier "
                          "outputs"),
    ]
    for option in reversed(options):
        command = option(command)
    return command
