"""tests/stub_child.py as a trainer package (python -m tests.stub_trainer), as worker/trainers/* are."""

PRELOAD = ("json",)
