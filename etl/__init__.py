"""Spark ETL: raw interaction logs → validated, feature-engineered Parquet tables."""

__version__ = "0.1.0"
