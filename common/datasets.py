"""The dataset names a job may ask for (the catalogue's `dataset` values). worker/data.py fetches,
builds and caches them; every run records which one it really trained on (`dataset_used`)."""

DATASET_HUB = "ThomasTheMaker/Arc-Corpus-sample"  # ~1k rows of text through the `datasets` library
DATASET_BUILTIN = "builtin"  # the deterministic corpus worker/data.py generates when the hub is out of reach
