"""Hierarchical embedding parameter server: L1 cache (GPU via CuPy, or numpy) → L2 volatile
store (an in-process hash map, Redis or Redis Cluster) → L3 persistent store (RocksDB) → the
table's default vector."""

from featureline.hps.server import ParameterServer

__all__ = ["ParameterServer"]
