"""The queue: the store and its SQL, migrations, sweeps and presets, merge, SLURM, ETA, adaptive repeats and
the time budget."""
