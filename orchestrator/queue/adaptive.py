"""`work --target-ci PCT`: when this machine's queue is empty, add repeat passes where the report's
intervals are wider than the target.

The worker computes the effects exactly as the report does (effects.analyse on this machine's
rows, the probe's noise when the machine has it). Every comparison whose 95% interval has a
relative half-width above the target (or no interval yet: a value ran once) and whose values have
fewer than `max_repeats` runs needs more runs: the jobs its runs came from are enqueued again with
the next repeat index (same configs, `repeat` = one past the highest pass in the database), so the
new runs form one more shuffled pass and the within-pass comparison still applies. One row of
`adaptive_decisions` records each decision: the pass added and the comparisons still too wide, or
the end ('targets met', 'maximum reached'). The report reads the target from there and says per
comparison whether it was met and with how many runs.

A pass number is never reused and never exceeds max_repeats - 1, so the loop ends even when the new
jobs fail. New jobs join the queue of every pool that has one (store.enqueue), so other machines
sharing the database run them too; their comparisons are decided by their own workers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sqlalchemy import text

from orchestrator.stats import effects as fx
from orchestrator.stats.noise import quiet_probe_cv
from common import variables as V
from common.errors import BadInput
from orchestrator.queue.sweep import block_positions, block_run_order, run_order, stretch_of
from orchestrator.queue.store import Store

SELECT_ROWS = "SELECT * FROM v_results WHERE machine_id = :machine_id ORDER BY run_id"
SELECT_NOISE = "SELECT noise_cv, facts FROM machines WHERE machine_id = :machine_id"
SELECT_MAX_REPEAT = "SELECT MAX(repeat) FROM jobs"
SELECT_JOB = "SELECT config, derived, block FROM jobs WHERE job_id = :job_id"
INSERT_DECISION = ("INSERT INTO adaptive_decisions "
                   "(machine_id, decision, repeat, jobs, target_ci, max_repeats, wide, created) "
                   "VALUES (:machine_id, :decision, :repeat, :jobs, :target_ci, :max_repeats, :wide, {now})")
SWEEP_NAME = "adaptive"


@dataclass
class Decision:
    decision: str  # 'added pass' | 'targets met' | 'maximum reached'
    repeat: int | None  # the pass added
    jobs: int  # new jobs enqueued
    wide: list[dict] = field(default_factory=list)  # comparisons wider than the target: what, half-width, runs
    advice: str = ""  # where repeats help (effects.Noise.where_repeats_help: Kalibera & Jones)

    @property
    def added(self) -> bool:
        return self.decision == "added pass" and self.jobs > 0

    def words(self, target_ci: float) -> str:
        still = ", ".join(f"{w['what']} +-{w['half_width'] * 100:.1f}%" if w["half_width"] is not None
                          else f"{w['what']} (no interval)" for w in self.wide[:6])
        more = f" and {len(self.wide) - 6} more" if len(self.wide) > 6 else ""
        if self.decision == "added pass":
            return (f"target +-{target_ci * 100:g}%: added pass {self.repeat} ({self.jobs} jobs) for "
                    f"{len(self.wide)} comparison(s) still wider: {still}{more}"
                    + (f"; {self.advice}" if self.advice else ""))
        if self.decision == "targets met":
            return f"target +-{target_ci * 100:g}%: every comparison met it"
        return f"target +-{target_ci * 100:g}%: maximum reached; still wider: {still}{more}"


def _what(e: fx.Effect) -> str:
    return f"{e.variable} power law" if e.kind == "elasticity" else f"{e.variable}={e.value} vs {e.baseline}"


def next_pass(store: Store, machine_id: int, *, target_ci: float, max_repeats: int) -> Decision:
    """Decide, record and enqueue (see the module's docstring)."""
    if not 0 < target_ci < 1:
        raise BadInput(f"--target-ci {target_ci * 100:g}: expected a percentage between 0 and 100")
    if max_repeats < 2:
        raise BadInput(f"--max-repeats {max_repeats}: an interval needs at least 2 runs per value")
    with store.transaction() as conn:
        rows = [dict(r._mapping) for r in conn.execute(text(SELECT_ROWS), {"machine_id": machine_id})]
        noise = quiet_probe_cv(*conn.execute(text(SELECT_NOISE), {"machine_id": machine_id}).one())
        top = conn.execute(text(SELECT_MAX_REPEAT)).scalar_one_or_none()
    analysis = fx.analyse(rows, [machine_id], probe_cv={machine_id: float(noise)} if noise is not None else None,
                          target_ci={machine_id: target_ci})
    effects = analysis.effects
    wide = [e for e in effects if e.target_met is False]
    listed = [{"what": _what(e), "half_width": e.half_width, "runs": e.min_runs} for e in wide]
    repeat = (int(top) + 1) if top is not None else 0
    open_ = [e for e in wide if e.min_runs < max_repeats]
    if not wide:  # (no comparison at all: nothing to narrow either)
        decision = Decision("targets met", None, 0)
    elif not open_ or repeat >= max_repeats:
        decision = Decision("maximum reached", None, 0, listed)
    else:
        job_ids = sorted({j for e in open_
                          for j in (e.job_ids.tolist() if hasattr(e.job_ids, "tolist") else e.job_ids)})
        jobs = repeat_jobs(store, job_ids, repeat)
        result = store.enqueue(name=SWEEP_NAME, source=f"work --target-ci (machine {machine_id})",
                               sweep_text=f"adaptive pass {repeat}: target +-{target_ci:g}, at most {max_repeats} "
                                          f"repeats\n" + "\n".join(w["what"] for w in listed),
                               jobs=jobs,
                               notes=[f"repeat pass {repeat} added by work --target-ci {target_ci * 100:g}"])
        decision = Decision("added pass", repeat, result.new, listed,
                            analysis.machines[machine_id].noise.where_repeats_help())
    with store.transaction(write=True) as conn:
        conn.execute(store.sql(INSERT_DECISION), {
            "machine_id": machine_id, "decision": decision.decision, "repeat": decision.repeat,
            "jobs": decision.jobs, "target_ci": target_ci, "max_repeats": max_repeats,
            "wide": json.dumps(listed)})
    return decision


def repeat_jobs(store: Store, job_ids: list[int], repeat: int) -> list[dict]:
    """The jobs `job_ids` again as repeat pass `repeat` (one job per configuration and block, however
    many passes it came from), in a blocked run order: each block's jobs beside each other, the blocks
    shuffled anew for the pass. What --target-ci and --budget enqueue."""
    jobs, seen = [], set()
    with store.transaction() as conn:
        for job_id in job_ids:
            config_text, derived, block = conn.execute(text(SELECT_JOB), {"job_id": job_id}).one()
            # the stored JSON leaves out a later release's variables at their default
            config = V.complete(json.loads(config_text)) | {"repeat": repeat}
            canonical = V.canonical_json(config)
            if (canonical, block) in seen:  # the same job from two earlier passes
                continue
            seen.add((canonical, block))
            jobs.append({"config": config, "config_hash": V.config_hash(config, block), "config_json": canonical,
                         "block": block, "derived": json.loads(derived) if derived else None})
    orders = block_positions(0, repeat, sorted({stretch_of(j["block"]) for j in jobs if j["block"] is not None}))
    for job in jobs:
        job["run_order"] = run_order(0, repeat, job["config_hash"]) if job["block"] is None else \
            block_run_order(0, repeat, orders[stretch_of(job["block"])], job["config_hash"])
    return sorted(jobs, key=lambda j: j["run_order"])
