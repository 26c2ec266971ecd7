"""The orchestrator: plans, the store and the reports. Sweep files and presets become jobs
(sweep.py), the store holds the queue and every measurement on SQLite or PostgreSQL (store.py,
migrations.py, merge.py), and the statistics and reports read them back (effects.py, report.py,
html_report.py). It imports common/ (the vocabulary) and never worker/: the worker uses the store,
not the other way round."""
