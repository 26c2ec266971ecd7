"""The orchestrator: plans, the store and the reports. Sweep files and presets become jobs
(sweep.py), the store holds the queue and every measurement on SQLite or PostgreSQL (store.py,
migrations.py, merge.py), and the statistics and reports read them back (effects.py, and the
report/ package: summary.md, index.html, results.csv). It imports common/ (the vocabulary) and
never worker/: the worker uses the store, not the other way round."""
