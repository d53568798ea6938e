"""The aggregation engine's operations: each one class with its Python half and its Spark half
over one declared partial (docs/ARCHITECTURE.md, "Features as definitions").

A **partial** is an operation's summary of a set of events. Its fields are declared once
(:class:`PartialField`: a name, its types, its value for no events); the tables of tiles, the
Spark frames and the online store's JSON all use those names.

- **The Python half** — ``init`` / ``add`` / ``merge`` / ``finish`` over JSON-able values,
  ``from_fields`` / ``json_column`` from a table of tiles, ``to_json`` / ``from_json`` — is
  what the stream, the API's read-time merge and the consistency report call.
- **The Spark half** — ``state_columns`` (one event's partial), ``merge_columns`` (a set of
  partials, in a group or over a frame), ``combine_columns`` (two partials) and
  ``finish_column`` — is what the backfill and the tiles written at publish call. It is
  built-in column expressions only, which the RAPIDS Accelerator runs on the GPU.

Each operation is one class in a module of this package (``base`` holds what they share);
adding one is a module and its line in :data:`OPERATIONS`, and the executors read nothing else
of it. pyspark is imported only inside the Spark half (the API never calls it).

Events missing the operation's column are skipped before ``add`` (``count`` without a column
counts every event the filter keeps).
"""

from featureline.core.operations.approx_distinct import (
    HLL_MAX_RANK,
    XXHASH_SEED,
    ApproxDistinct,
    hll_estimate,
    hll_register,
)
from featureline.core.operations.base import (
    Getter,
    Operation,
    Parameters,
    Partial,
    PartialField,
)
from featureline.core.operations.extremes import Latest, Max, Min
from featureline.core.operations.first import First
from featureline.core.operations.last import PAIR_TS, PAIR_VALUE, Last, LastK, pair_column
from featureline.core.operations.percentile import ApproxPercentile
from featureline.core.operations.sums import Count, Mean, Sum, Variance

OPERATIONS: dict[str, type[Operation]] = {
    op.name: op for op in (Count, Sum, Mean, Variance, Min, Max, Latest, Last, LastK,
                            ApproxDistinct, First, ApproxPercentile)}

__all__ = ["HLL_MAX_RANK", "OPERATIONS", "PAIR_TS", "PAIR_VALUE", "XXHASH_SEED",
           "ApproxDistinct", "Getter", "Operation", "Parameters", "Partial", "PartialField",
           "hll_estimate", "hll_register", "pair_column"]
