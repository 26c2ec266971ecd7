"""The training children: one trainer contract (harness.py) and one trainer per framework."""
