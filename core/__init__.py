"""The core below every stage: errors, the settings base model, durations, the Redis client
factory and the ``metadata.json`` contract (docs/ARCHITECTURE.md, "Layers").

Core imports no stage package and no pyspark, so every process — the API's included — can
use it.
"""

from importlib.metadata import version

__version__ = version("featureline")
