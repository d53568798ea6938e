"""FastAPI ranking API: online features and embedding lookups (docs/ARCHITECTURE.md, api/)."""
