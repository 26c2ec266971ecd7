"""Per-job overhead of the queue and the child, on tiny jobs: jobs per minute, how much of each job's
wall time is not timed steps, and where it goes (claim, knobs, sensors, fork, child setup, warmup,
after the timed steps, record...).

    venv/bin/python benchmarks/queue_overhead.py [--jobs 12] [--steps 5] [--rounds 1] [--tree PATH ...]
                                                 [--set K=V ...] [--axis K=V1,V2,...]

--tree: measure another checkout's worker too (e.g. main, for a before/after); with several trees the
rounds alternate between them (interleaved: the machine's load hits each alike) and each tree gets its
own table. Each round enqueues --jobs tiny jobs in a throwaway database and state dir, runs one job to
warm the probe cache and the data cache, then times a worker (in a process of its own, started on that
tree) over the rest. Prints figures; asserts nothing.

The tiny jobs: n_layers=1 seq_len=32 batch_size=4 vocab_size=512 warmup_steps=1, d_model 32, 40, ...
one width per job. --set overrides a setting of theirs (or adds one); --axis replaces the widths by
another varied variable, e.g. the quick preset's base, its seeds varied:
    --set d_model=256 --set n_layers=2 --set seq_len=64 --set vocab_size=1024 --set steps=10
    --set warmup_steps=2 --axis seed=0,1,2,3,4,5,6,7,8,9,10,11,12

The breakdown is measured in that worker process by timing the worker's own calls (the Store, the
knobs, the sensors, the fork server) and in the child from what it reports (setup_s, first_step_s,
train_s, its timed window, and `applied["setup_phases_s"]` where the trainer reports it):

    claim        take back stale runs + claim the next job (DB)
    check+data   availability checks, data prepare (cached after the first job)
    knobs        apply the job's settings (journal, sysfs) and restore them after
    sensors      sampler start/stop/summary
    server       fork server (re)starts (amortised over the jobs)
    to child     request written -> child module starts (fork, redirect, runpy)
    setup        child module start -> first step (imports, data, model, optimizer)
    warmup       the untimed warmup step (first_step_s; with --set warmup_steps=N the others count
                 in "to child")
    after        end of the timed steps -> the worker has the child's reply, in the child's parts:
      eval         the validation loss on the held-out windows (eval_s; applied.val_tokens of them)
      save         the model saved (applied.setup_phases_s)
      read back    the settings read back, the GEMM route's proof where one was made (ditto)
      rest         the rest: the throughput figures, the result line, the child's exit, the reply
    record       finish (DB), heartbeats, progress counts
    other        the rest of the worker's loop (events, outcome handling)
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("claim", "check+data", "knobs", "sensors", "server", "to child", "setup", "warmup", "after",
          "record", "other")
AFTER = ("eval", "save", "read back", "rest")  # the parts of "after"
TINY = {"n_layers": "1", "seq_len": "32", "batch_size": "4", "warmup_steps": "1", "vocab_size": "512"}


def _timed(owner, name: str, bucket: str, totals: dict) -> None:
    """Replace owner.name with a wrapper adding its run time to totals[bucket]."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[bucket] = totals.get(bucket, 0.0) + time.perf_counter() - t

    setattr(owner, name, wrapper)


def _worker_side(db: str, out: str) -> None:
    """In a process started on the tree under test: run a worker over the queue, timing its calls;
    per job the worker-side phases and the child's reply times (JSON lines in `out`)."""
    from contextlib import contextmanager

    from orchestrator.queue.store import Store
    from worker import spawn as child, loop
    from worker.knobs import settings as knobs
    from worker.machine import sensors

    totals: dict = {}
    for name in ("take_back_stale", "claim"):
        _timed(Store, name, "claim", totals)
    for name in ("finish", "heartbeat", "counts"):
        _timed(Store, name, "record", totals)
    _timed(knobs, "unavailable", "check+data", totals)
    _timed(loop, "_trainer_missing", "check+data", totals)
    _timed(loop.Worker, "_prepare_data", "check+data", totals)
    for name in ("start", "stop", "summary"):
        _timed(sensors.RunSampler, name, "sensors", totals)
    _timed(child.ForkServer, "_start", "server", totals)
    applied = knobs.applied

    @contextmanager
    def timed_applied(*args, **kwargs):  # apply and restore, not the child in between
        t = time.perf_counter()
        with applied(*args, **kwargs) as spec:
            totals["knobs"] = totals.get("knobs", 0.0) + time.perf_counter() - t
            yield spec
            t = time.perf_counter()
        totals["knobs"] += time.perf_counter() - t

    knobs.applied = timed_applied
    spawn = child.ForkServers.run
    jobs = []

    def timed_spawn(self, job, **kwargs):
        sent = time.time()
        outcome = spawn(self, job, **kwargs)
        jobs.append({"run_id": job["run_id"], "sent_unix_s": sent, "reply_unix_s": time.time(),
                     "window": outcome.timed_window})
        return outcome

    child.ForkServers.run = timed_spawn
    marks = []
    store = Store(db)
    options = loop.WorkerOptions(heartbeat_s=5.0)

    def on_event(event) -> None:
        if event.kind in ("claimed", "stop"):
            marks.append((time.perf_counter(), dict(totals)))

    worker = loop.Worker(store, options, on_event=on_event)
    start = time.perf_counter()
    worker.run()
    elapsed = time.perf_counter() - start
    # the worker start (probe cache, register, restore) is what comes before the first claim event
    with open(out, "w") as f:
        f.write(json.dumps({"elapsed_s": elapsed, "start_s": marks[0][0] - start if marks else None}) + "\n")
        for i, job in enumerate(jobs):
            (t0, before), (t1, after) = marks[i], marks[i + 1]
            phases = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(after) | set(before)}
            f.write(json.dumps({**job, "cycle_s": t1 - t0, "phases": phases}) + "\n")


def _round(tree: Path, jobs: int, steps: int, sets: list[str], axis: str | None = None) -> list[dict]:
    """One round on one tree: per timed job, its phases (seconds)."""
    tmp = Path(tempfile.mkdtemp(prefix="cpubench-overhead-"))
    db = str(tmp / "results.db")
    env = {**os.environ, "BENCH_STATE_DIR": str(tmp / "state"), "BENCH_OUTPUT_DIR": str(tmp / "output")}
    python = sys.executable
    axis = axis or "d_model=" + ",".join(str(32 + 8 * i) for i in range(jobs + 1))
    given = {**TINY, "steps": str(steps), **dict(kv.split("=", 1) for kv in sets)}
    subprocess.run([python, str(tree / "bench.py"), "enqueue", "--db", db, "--axis", axis,
                    *(a for k, v in given.items() for a in ("--set", f"{k}={v}"))],
                   check=True, env=env, cwd=tree,
                   stdout=subprocess.DEVNULL)
    # The first job pays for the probe and the data cache: warm them with one job, then time the rest.
    subprocess.run([python, str(tree / "bench.py"), "work", "--db", db, "--max-jobs", "1"], check=True, env=env,
                   cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = tmp / "phases.jsonl"
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import queue_overhead as q; " \
           f"q._worker_side({db!r}, {str(out)!r})"
    subprocess.run([python, "-c", code], check=True, env={**env, "PYTHONPATH": str(tree)}, cwd=tree,
                   stdout=subprocess.DEVNULL)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    head, timed = lines[0], lines[1:]
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        runs = {r["run_id"]: r for r in conn.execute("SELECT * FROM runs")}
    rows = []
    for job in timed:
        run = runs[job["run_id"]]
        if run["status"] != "done":
            raise SystemExit(f"run {job['run_id']} {run['status']}: {run['reason']}")
        p = job["phases"]
        applied = json.loads(run["applied"] or "{}")
        reply_gap = job["reply_unix_s"] - job["window"]["end_unix_s"]
        timed_span = job["window"]["end_unix_s"] - job["window"]["start_unix_s"]
        # to child + warmup (+ the server's start, when this job started one)
        warmup = job["window"]["start_unix_s"] - job["sent_unix_s"] - run["setup_s"] - p.get("server", 0.0)
        row = {
            "claim": p.get("claim", 0.0), "check+data": p.get("check+data", 0.0), "knobs": p.get("knobs", 0.0),
            "sensors": p.get("sensors", 0.0), "server": p.get("server", 0.0),
            "setup": run["setup_s"], "after": reply_gap, "record": p.get("record", 0.0),
            "timed": run["train_s"], "timed gaps": timed_span - run["train_s"], "cycle": job["cycle_s"],
            "wall_s": run["wall_s"], "first_step_s": run["first_step_s"],
        }
        # The child's own clock starts at its module's import (setup_s): what came before it (fork,
        # redirect, runpy) is the request-to-window time less setup and the warmup steps.
        row["warmup"] = run["first_step_s"]  # the one warmup step (with --set warmup_steps=N: its first)
        row["to child"] = warmup - row["warmup"]
        row["other"] = row["cycle"] - sum(row[k] for k in PHASES if k != "other") - row["timed"] - row["timed gaps"]
        row["amortised"] = head["elapsed_s"] / len(timed) - run["train_s"]  # worker start and all
        row["child phases"] = applied.get("setup_phases_s") or {}
        row["eval"] = run["eval_s"] or 0.0
        row["save"] = row["child phases"].get("save", 0.0)
        row["read back"] = row["child phases"].get("read_back", 0.0)
        row["rest"] = row["after"] - row["eval"] - row["save"] - row["read back"]
        row["val_tokens"] = applied.get("val_tokens")
        row["proven"] = (applied.get("gemm_route") or {}).get("proven", "in this run")
        rows.append(row)
    return rows


def _summary(label: str, rows: list[dict], elapsed_note: str = "") -> None:
    med = {k: statistics.median(r[k] for r in rows) for k in (*PHASES, "timed", "timed gaps", "cycle")}
    overhead = [r["cycle"] - r["timed"] for r in rows]
    print(f"\n== {label}: {len(rows)} tiny jobs{elapsed_note}")
    per_minute = 60 / statistics.median(r["cycle"] for r in rows)
    print(f"per-job total overhead beyond timed steps (cycle - train_s): median {statistics.median(overhead):.3f} s, "
          f"min {min(overhead):.3f}, max {max(overhead):.3f}; {per_minute:.1f} jobs/min")
    print(f"  amortised over the whole worker (its start, the fork server's, every job; elapsed/jobs - train_s): "
          f"median {statistics.median(r['amortised'] for r in rows):.3f} s")
    print(f"  {'phase':<12} {'median s':>9} {'mean s':>8} {'max s':>7}")
    for k in (*PHASES, "timed gaps"):
        values = [r[k] for r in rows]
        print(f"  {k:<12} {med[k]:9.3f} {statistics.fmean(values):8.3f} {max(values):7.3f}")
        for part in AFTER if k == "after" else ():
            values = [r[part] for r in rows]
            print(f"    {part:<10} {statistics.median(values):9.3f} {statistics.fmean(values):8.3f} {max(values):7.3f}")
    print(f"  {'timed':<12} {med['timed']:9.3f}   (train_s, not overhead)")
    tokens = sorted({r["val_tokens"] for r in rows}, key=str)
    proved = sum(1 for r in rows if r["proven"].startswith("in this run"))
    print(f"  evaluated {', '.join(map(str, tokens))} held-out tokens a run; the GEMM route proved by a verbose "
          f"step in {proved} of {len(rows)} runs (the rest reuse the fork server's proof)")
    child = [r["child phases"] for r in rows if r["child phases"]]
    if child:
        print("  child's setup phases (applied.setup_phases_s), median s: " + ", ".join(
            f"{k} {statistics.median(c.get(k, 0.0) for c in child):.3f}" for k in child[0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=12, help="timed jobs per round (one more warms the caches)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1, help="rounds per tree, interleaved across trees")
    parser.add_argument("--set", action="append", default=[], metavar="K=V", dest="sets",
                        help="another setting of the tiny jobs (e.g. cores=1: no OpenMP barrier on a loaded machine)")
    parser.add_argument("--axis", metavar="K=V1,V2", help="the varied variable instead of the tiny jobs' d_model "
                                                          "widths (give --jobs + 1 values)")
    parser.add_argument("--tree", action="append", type=Path,
                        help="a checkout to measure (repeatable; default: this one)")
    args = parser.parse_args()
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    for tree in trees:
        if not (tree / "bench.py").exists():
            parser.error(f"--tree {tree}: no bench.py there")
    results: dict[Path, list[list[dict]]] = {t: [] for t in trees}
    for i in range(args.rounds):
        for tree in trees:
            t = time.perf_counter()
            rows = _round(tree, args.jobs, args.steps, args.sets, args.axis)
            results[tree].append(rows)
            med = statistics.median(r["cycle"] - r["timed"] for r in rows)
            print(f"round {i + 1} {tree}: per-job overhead median {med:.3f} s ({time.perf_counter() - t:.0f} s)",
                  flush=True)
    for tree in trees:
        rounds = results[tree]
        medians = [statistics.median(r["cycle"] - r["timed"] for r in rows) for rows in rounds]
        spread = f"; round medians {', '.join(f'{m:.3f}' for m in medians)}" if len(medians) > 1 else ""
        _summary(str(tree), [r for rows in rounds for r in rows], spread)


if __name__ == "__main__":
    main()
