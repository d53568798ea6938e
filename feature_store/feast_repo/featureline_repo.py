"""The definitions of this Feast repository, derived from the ETL's metadata.json.

``feast apply`` imports every Python file of this folder, and this is the only one. Which ETL
output it describes: ``FEATURELINE_OUTPUT``, else ``etl.output.path`` of the configuration in
``FEATURELINE_CONFIG`` (default: the project's featureline.yaml).
"""

from pathlib import Path

from featureline.serving import feast_definitions

globals().update(feast_definitions(Path(__file__).parent).named())
