"""The launcher, on top of the stages: the ``featureline`` console script, the composition
of ``featureline.yaml`` from the stages' sections, and the end-to-end demo
(docs/ARCHITECTURE.md, "Layers")."""
