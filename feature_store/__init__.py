"""Feast feature store over the ETL's entities/ tables (docs/ARCHITECTURE.md, feature_store/)."""
