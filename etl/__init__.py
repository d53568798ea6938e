"""Spark ETL: raw interaction logs → validated, feature-engineered Parquet tables."""
