"""Hierarchical embedding parameter server: GPU/CPU cache → volatile store → RocksDB."""
