"""How long the queued jobs of a machine will take, learned from its finished runs.

Two estimates, the better one for each queued job:
- A configuration already finished in this pool (another repeat of it, or its baseline in another
  block) takes what it took: the mean cost of its finished runs. This is exact where the model is
  not: compiling (inductor, XLA), emulated bf16, another framework, and skipped runs that cost
  nothing. After the first repeat pass every queued job has such a measurement, so the estimate is
  right however unequal the jobs are, and whatever order the blocks run in.
- Any other job: wall_s = overhead_s + s_per_work * work, where work is the training arithmetic of
  a job (common/compute.py's exact flops_per_step, the worker's own count, times the steps run,
  warm-up included), so a queued job needs no measurement. Both coefficients are fitted by least
  squares on the pool's latest done runs (a sample of DONE_SAMPLE) and kept non-negative.
  Where the machine has a fitted cost model (orchestrator/queue/predict.py, model_of: its done runs'
  step times), work may instead be the model's predicted step seconds times the steps run: it knows
  what FLOPs alone do not (bf16 or another framework at the same FLOPs, small GEMMs' low rate). The
  ETA takes whichever of the two explains the done runs' costs better (smaller squared log error),
  and FLOPs for a queued job the model refuses (a setting the machine never finished).
A run's cost is the larger of its wall_s (the child's life) and its claim-to-finish time (the
worker's share too: knobs, data), less what its repeats will not pay again (one_off_s: the cold
compile into the shared cache, the GEMM peak of a new CPU set). On a 2-vCPU AVX-512 EPYC VM's quick
sweep (3.7 min of runs) those two were 12 s and 5 s of first runs costing 17 s and 8 s, and the ETA
counted them again for every repeat: 26% high at halfway. The progress bar calls this every few
seconds; the fit is cached until a run finishes.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict

import numpy as np
from sqlalchemy import text

from common.compute import flops_per_step
from common.variables import steps_trained
from orchestrator.stats.config_index import CONFIG_NAMES
from orchestrator.queue.store import Store

# A configuration whatever its repeat (and block): every variable's column but repeat.
_CONFIG = ", ".join(f'j."{n}"' for n in CONFIG_NAMES)
_COST = "CASE WHEN r.wall_s IS NULL OR r.finished - r.claimed > r.wall_s THEN r.finished - r.claimed ELSE r.wall_s END"
# The pool's latest finished runs with their cost: the fit needs a sample, not the whole history
# (a 100k-job sweep would read every run at every progress update).
FINISHED_ROWS = f"""
SELECT r.run_id, r.status, {_COST}, r.applied, {_CONFIG}
FROM runs r JOIN jobs j ON j.job_id = r.job_id
WHERE r.pool_id = :pool_id AND r.status IN ('done', 'failed', 'skipped') AND r.finished IS NOT NULL
"""
SELECT_FINISHED = FINISHED_ROWS + "ORDER BY r.run_id DESC LIMIT {limit}\n"
# The jobs still queued for the pool: its queue rows once it has claimed, else no run row yet or a
# row taken back as 'queued'.
SELECT_QUEUED = f"""
SELECT {_CONFIG} FROM queue q JOIN jobs j ON j.job_id = q.job_id WHERE q.pool_id = :pool_id AND q.cores <= :fits
"""
SELECT_QUEUED_UNFILLED = f"""
SELECT {_CONFIG}
FROM jobs j LEFT JOIN runs r ON r.job_id = j.job_id AND r.pool_id = :pool_id
WHERE r.run_id IS NULL OR r.status = 'queued'
"""
SELECT_FILLED = "SELECT filled FROM pools WHERE pool_id = :pool_id"
SELECT_JOB_CONFIGS = f"SELECT j.job_id, {_CONFIG} FROM jobs j WHERE j.job_id IN ({{ids}})"
# Jobs wider than a pool's workers: a worker claims the first job in run order that fits its CPUs
# (store.POP_QUEUE) and leaves the wider ones queued for a wider worker. Where a queued job wider than
# every job the pool has run lies before the pool's latest claim in run order, a worker passed it over:
# the pool's workers are narrower, and its jobs that wide wait (wider_waiting), out of the ETA.
SELECT_QUEUE_WIDEST = "SELECT MAX(cores) FROM queue WHERE pool_id = :pool_id"
RAN_AS_WIDE = """
SELECT 1 FROM runs r JOIN jobs j ON j.job_id = r.job_id
WHERE r.pool_id = :pool_id AND r.status <> 'queued' AND j.cores >= :cores LIMIT 1
"""
SELECT_REACH = """
SELECT MAX(j.cores), MAX(j.run_order) FROM runs r JOIN jobs j ON j.job_id = r.job_id
WHERE r.pool_id = :pool_id AND r.status <> 'queued'
"""
ANY_PASSED_OVER = "SELECT 1 FROM queue WHERE pool_id = :pool_id AND cores > :widest AND run_order < :latest LIMIT 1"
COUNT_WIDER = "SELECT COUNT(*) FROM queue WHERE pool_id = :pool_id AND cores > :widest"
ANY_WIDTH = 2**31 - 1
DONE_SAMPLE = 2000
_HEAD = 4  # a finished row's run_id, status, cost, applied before its configuration

# (db, pool) -> (finished sample's key, learn()'s overhead_s, s_per_work and cost per configuration)
_fits: dict[tuple[str, int], tuple[tuple, tuple[float, float, dict]]] = {}


def work(config: dict) -> float:
    """Training FLOPs of a whole run: the exact count of one step (the worker's own) times the steps
    run, warm-up included."""
    return float(flops_per_step(config)) * steps_trained(config)


def _config(values: tuple) -> dict:
    return dict(zip(CONFIG_NAMES, values))


def fit(walls: np.ndarray, works: np.ndarray) -> tuple[float, float]:
    """overhead_s, s_per_work >= 0 minimising the squared error of wall_s."""
    if len(walls) >= 2 and np.ptp(works) > 0:
        a, b = np.linalg.lstsq(np.column_stack([np.ones_like(works), works]), walls, rcond=None)[0]
        if a >= 0 and b >= 0:
            return float(a), float(b)
        if b < 0:  # bigger jobs were not slower: the sizes are too close to tell, use the mean
            return float(walls.mean()), 0.0
    # One size only (or a negative overhead): time proportional to work.
    return 0.0, float(walls.sum() / works.sum())


def wider_waiting(conn, pool_id: int) -> tuple[int, int | None]:
    """(how many of the pool's queued jobs wait for a worker wider than its workers: 0 unless one of
    them was passed over, the widest job the pool has run: None before its first claim, or where it
    has run a job as wide as any queued, which is all it takes to tell that none waits)."""
    queue_widest = conn.execute(text(SELECT_QUEUE_WIDEST), {"pool_id": pool_id}).scalar_one()
    if queue_widest is None or conn.execute(text(RAN_AS_WIDE), {"pool_id": pool_id, "cores": queue_widest}).first():
        return 0, None  # (the usual case: one indexed read of its queue, and its runs read up to the first that wide)
    widest, latest = conn.execute(text(SELECT_REACH), {"pool_id": pool_id}).one()
    if widest is None:
        return 0, None
    params = {"pool_id": pool_id, "widest": widest, "latest": latest}
    if conn.execute(text(ANY_PASSED_OVER), params).first() is None:
        return 0, int(widest)
    return int(conn.execute(text(COUNT_WIDER), params).scalar_one()), int(widest)


def estimate_remaining_s(store: Store, machine_id: int, *, pool_id: int | None = None,
                         wider: tuple[int, int | None] | None = None) -> float | None:
    """Seconds the queued jobs of the pool (the machine's own unless given) should take, less those that
    wait for a wider worker (wider_waiting: read here unless the caller gives what it read, as the live
    progress does, so that its count and its ETA split the queue alike); None while no run of it is done."""
    if pool_id is None:
        pool_id = store.pool_id(machine_id)
    with store.transaction() as conn:
        finished = conn.execute(text(SELECT_FINISHED.format(limit=DONE_SAMPLE)), {"pool_id": pool_id}).all()
        if not any(r[1] == "done" for r in finished):
            return None
        filled = conn.execute(text(SELECT_FILLED), {"pool_id": pool_id}).scalar_one()
        waiting, widest = (0, None) if filled is None else wider if wider is not None else wider_waiting(conn, pool_id)
        queued_rows = conn.execute(text(SELECT_QUEUED if filled is not None else SELECT_QUEUED_UNFILLED),
                                   {"pool_id": pool_id, "fits": widest if waiting else ANY_WIDTH}).all()
    return remaining_s(_learned(store, machine_id, pool_id, finished), queued_rows)


def predicted_job_s(store: Store, machine_id: int, job_id: int, *, pool_id: int | None = None) -> float | None:
    """Seconds one job of the pool (the machine's own unless given) should take from claim to
    finish, as the ETA counts it; None while no run of the pool is done. The store's take-back asks
    it how far past its time a dead worker's child had run (store.blame)."""
    return job_costs(store, machine_id, [job_id], pool_id=pool_id).get(job_id)


def _learned(store: Store, machine_id: int, pool_id: int, finished: list) -> tuple:
    """learn() of the pool's finished sample, cached until a run finishes."""
    key, sample = (store.url, pool_id), (len(finished), finished[0][0])
    cached = _fits.get(key)
    if cached is None or cached[0] != sample:
        done = sum(r[1] == "done" for r in finished)
        _fits[key] = (sample, learn(finished, machine_model(store, machine_id, done)))
        cached = _fits[key]
    return cached[1]


def job_costs(store: Store, machine_id: int, job_ids: list[int], *, pool_id: int | None = None) -> dict[int, float]:
    """Seconds each job (by id) should take on the machine's pool (its own unless given), as the ETA
    counts a queued job (a configuration already finished costs what it cost; another, the fitted
    model's guess); empty while the pool has finished no run. What --budget weighs its choices by."""
    if pool_id is None:
        pool_id = store.pool_id(machine_id)
    with store.transaction() as conn:
        finished = conn.execute(text(SELECT_FINISHED.format(limit=DONE_SAMPLE)), {"pool_id": pool_id}).all()
        if not any(r[1] == "done" for r in finished) or not job_ids:
            return {}
        rows = [r for chunk in range(0, len(job_ids), 500) for r in conn.execute(text(SELECT_JOB_CONFIGS.format(
            ids=", ".join(str(int(j)) for j in job_ids[chunk:chunk + 500])))).all()]
    learned = _learned(store, machine_id, pool_id, finished)
    return {int(r[0]): remaining_s(learned, [tuple(r[1:])]) for r in rows}


# (db, machine) -> (done runs when fitted, the cost model or None): refitted when the done runs have
# grown by a quarter, not after every run (a fit reads every done run: ~0.2 s for the quick sweep's).
_models: dict[tuple[str, int], tuple[int, object]] = {}


def machine_model(store: Store, machine_id: int, done: int):
    """The cost model of the machine's done runs (queue/predict.model_of, its one entry point for a
    fitted machine), or None where it cannot be fitted (too few runs): the ETA then uses FLOPs."""
    from common.errors import BenchError
    from orchestrator.queue.predict import model_of
    key = (store.url, machine_id)
    cached = _models.get(key)
    if cached is not None and done < 1.25 * cached[0] + 4:
        return cached[1]
    try:
        model = model_of(store, machine_id)
    except (BenchError, ValueError, np.linalg.LinAlgError):
        model = None
    _models[key] = (done, model)
    return model


def one_off_s(applied) -> float:
    """Seconds of a run its repeats will not pay again, from what it recorded (`applied`, JSON): the
    cold compile of a config into the shared cache (prewarm_s, compile_cache=warm) and the GEMM peak
    of a CPU set measured for it (peak_gflops.measure_s; cached for every later run on the set)."""
    try:
        a = json.loads(applied) if isinstance(applied, str) else (applied or {})
        return float(a.get("prewarm_s") or 0.0) + float((a.get("peak_gflops") or {}).get("measure_s") or 0.0)
    except (TypeError, ValueError, AttributeError):
        return 0.0


def predicted_work(model, config: dict) -> float | None:
    """The cost model's seconds of training for a whole run of `config` (its predicted step time
    times the steps run, warm-up included); None where the model refuses it."""
    ms = model.point_ms(config) if model is not None else None
    return None if ms is None else ms / 1e3 * steps_trained(config)


def _log_error(walls: np.ndarray, guess: np.ndarray) -> float:
    ok = (walls > 0) & (guess > 0)
    return float(np.mean(np.log(guess[ok] / walls[ok]) ** 2)) if ok.any() else math.inf


def learn(finished: list[tuple], model=None) -> tuple:
    """From finished rows (run_id, status, cost, applied, *config; SELECT_FINISHED's columns):
    overhead_s and s_per_work fitted on the done runs, and the mean cost of each configuration, each
    cost less its one-off part. With the machine's cost model: also its fit on predicted seconds, and
    the model itself when that fit explains the done runs better than FLOPs (a fourth item)."""
    def cost(r) -> float:
        return max(0.0, float(r[2] or 0.0) - one_off_s(r[3]))

    done = [r for r in finished if r[1] == "done" and r[2] is not None]
    walls, works = np.array([(cost(r), work(_config(r[_HEAD:]))) for r in done], dtype=float).reshape(-1, 2).T
    overhead_s, s_per_work = fit(walls, works)
    costs = defaultdict(list)
    for r in finished:
        costs[tuple(r[_HEAD:])].append(cost(r))
    per_config = {k: sum(v) / len(v) for k, v in costs.items()}
    if model is not None and len(done) >= 2:
        predicted = [predicted_work(model, _config(r[_HEAD:])) for r in done]
        if all(p is not None for p in predicted):
            seconds = np.array(predicted, dtype=float)
            by_model = fit(walls, seconds)
            if _log_error(walls, by_model[0] + by_model[1] * seconds) < \
                    _log_error(walls, overhead_s + s_per_work * works):
                return overhead_s, s_per_work, per_config, (model, *by_model)
    return overhead_s, s_per_work, per_config


def queued_of(finished_row: tuple) -> tuple:
    """A finished row as a queued one (its config's values): what remaining_s reads."""
    return tuple(finished_row[_HEAD:])


def remaining_s(learned: tuple[float, float, dict], queued: list[tuple]) -> float:
    """Seconds the queued rows (config values; SELECT_QUEUED's columns) should take."""
    overhead_s, s_per_work, per_config = learned[:3]
    model, model_overhead_s, s_per_second = learned[3] if len(learned) > 3 else (None, 0.0, 0.0)
    total = 0.0
    for r in queued:
        known = per_config.get(tuple(r))
        if known is not None:
            total += known
            continue
        config = _config(r)
        seconds = predicted_work(model, config)
        total += (overhead_s + s_per_work * work(config) if seconds is None
                  else model_overhead_s + s_per_second * seconds)
    return float(total)
