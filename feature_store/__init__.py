"""Feast feature store over the ETL's entities/ tables (DESIGN.md, feature_store/)."""
