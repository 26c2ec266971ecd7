"""The orchestrator: the variable catalogue, sweep expansion, the job store and reports."""
