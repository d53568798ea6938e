"""The reference trainer: a DLRM-style ranking model built from an ETL output's
``metadata.json`` alone, trained on its TFRecords, its embedding tables exported for the
parameter server (docs/ARCHITECTURE.md, "Scoring"). Needs the ``[tf]`` extra."""
