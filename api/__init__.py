"""FastAPI ranking API: online features and embedding lookups (DESIGN.md, api/)."""
