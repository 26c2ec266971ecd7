"""What the worker measures of the machine: the probe, noise, sensors over a run, GEMM peaks."""
