"""The machine's run-to-run noise, measured by the probe: a few identical short training runs.

Each run trains the same small network (two linear layers with GELU, AdamW, one fixed batch) for a
fixed number of steps and keeps its median step time; the noise is the coefficient of variation of
those medians (sample standard deviation / mean), the figure the report compares effects against
(`machines.noise_cv`). The runs share one process (the probe's measuring child) and are spaced out
in time, so the figure holds what disturbs a benchmark from one run to the next on this machine
(other tenants, steal, frequency and thermal changes, background work); differences between fresh
processes (memory layout, library dispatch) are not in it, and the repeats in a report still show
those. It is measured once per probe and cached with the other limits; `bench.py machine
--remeasure` measures it again.
"""

from __future__ import annotations

import statistics
import time


def run_medians(torch, *, runs: int, steps: int, width: int, gap_s: float, adamw: bool = True) -> list[float]:
    """The median step time (ms) of each of `runs` identical training runs of `steps` steps: AdamW,
    or a plain SGD update written out where importing torch.optim (about 1 s: it pulls in dynamo)
    would cost more than the runs (the quick probe of the tests)."""
    torch.manual_seed(0)
    batch = torch.randn(64, width)
    target = torch.randn(64, width)
    medians = []
    for i in range(runs):
        if i:
            time.sleep(gap_s)  # spread the runs out: noise that comes and goes is what we are after
        model = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                    torch.nn.Linear(4 * width, width))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3) if adamw else None
        times = []
        for step in range(steps + 2):  # two untimed steps: allocation, kernel choice, optimizer state
            t0 = time.perf_counter()
            loss = torch.nn.functional.mse_loss(model(batch), target)
            model.zero_grad(set_to_none=True)
            loss.backward()
            if opt is not None:
                opt.step()
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(p.grad, alpha=-1e-3)
            if step >= 2:
                times.append((time.perf_counter() - t0) * 1e3)
        medians.append(statistics.median(times))
    return medians


def coefficient_of_variation(values: list[float]) -> float | None:
    """Sample standard deviation over mean; None with fewer than two values."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else None


def measure_noise(torch, quick: bool = False) -> dict:
    """The noise figure and what it rests on, for the probe's limits."""
    runs, steps, width, gap_s = (3, 5, 64, 0.0) if quick else (7, 30, 256, 0.3)
    t0 = time.perf_counter()
    medians = run_medians(torch, runs=runs, steps=steps, width=width, gap_s=gap_s, adamw=not quick)
    cv = coefficient_of_variation(medians)
    return {"noise_cv": None if cv is None else round(cv, 4),
            "noise": {"runs": runs, "steps": steps, "width": width, "gap_s": gap_s,
                      "medians_ms": [round(m, 4) for m in medians], "seconds": round(time.perf_counter() - t0, 2)}}
