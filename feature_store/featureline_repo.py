"""The definitions of this Feast repository, derived from the ETL's metadata.json.

``feast apply`` imports this file (and no other: see .feastignore). Which ETL output it
describes: ``FEATURELINE_OUTPUT``, else ``etl.output.path`` of the project's featureline.yaml.
"""

from pathlib import Path

from feature_store.repo import repository_definitions

globals().update(repository_definitions(Path(__file__).parent).named())
