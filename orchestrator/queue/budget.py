"""`run --budget` / `work --budget`: a time budget for one sweep on one machine, spent where the
answer is least sure.

The sweep's first pass runs whole (every comparison and every joint configuration once). Each time
the queue empties, next_runs() fits the effects as the report does and gives the remaining time to
the comparisons that one more run a side narrows most per second: a comparison without an interval
yet first (a value that ran once), then by the expected narrowing of its shown interval,
half-width * (1 - sqrt(n / (n + 1))) for n runs a side, over the predicted seconds of its jobs
(eta.job_costs: what the same configuration cost before). A comparison stops getting runs when its
interval is narrow enough (`NARROW`) or resolved (it lies more than `RESOLVED_MARGIN` half-widths
from no change, whichever way). The choice looks only at widths, run counts and costs, never at
which way an estimate points. The chosen comparisons' jobs (each value with the baseline of its
own block) run again as one more repeat pass in a blocked order (adaptive.repeat_jobs), so a
comparison's runs stay side by side in time.

What was spent is read from the runs (claim to finish, as the ETA counts a run's cost), never
kept in a worker: a stopped or killed worker resumes under the remainder, and asking the same sweep
for a larger budget continues it. Every decision is a row of `budget_decisions`; the report reads
them to say how the budget was spent.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import text

from common import variables as V
from common.errors import BadInput
from orchestrator.stats import effects as fx
from orchestrator.queue.adaptive import SELECT_MAX_REPEAT, SELECT_NOISE, SELECT_ROWS, repeat_jobs
from orchestrator.queue.eta import _COST, job_costs
from orchestrator.stats.noise import quiet_probe_cv
from orchestrator.queue.store import Store
from common.blocks import stretch_of

SWEEP_NAME = "budget"  # the sweep rows of the runs a budget adds
NARROW = 0.05  # a comparison whose shown interval is within +-5% needs no more runs
RESOLVED_MARGIN = 2.0  # ... nor one whose interval lies this many half-widths from no change
MIN_BATCH_S = 20.0  # the runs added at one decision: at least this many predicted seconds ...
BATCH_SHARE = 0.25  # ... or this share of what was spent, so decisions stay a small part of the time

SELECT_BUDGET = "SELECT budget_id, budget_s FROM budgets WHERE machine_id = :machine_id AND sweep_id = :sweep_id"
INSERT_BUDGET = ("INSERT INTO budgets (machine_id, sweep_id, budget_s, created) "
                 "VALUES (:machine_id, :sweep_id, :budget_s, {now})")
UPDATE_BUDGET = "UPDATE budgets SET budget_s = :budget_s WHERE budget_id = :budget_id"
# The newest sweep a user enqueued (not one a budget or --target-ci added): what `work --budget` spends on.
SELECT_NEWEST_SWEEP = "SELECT MAX(sweep_id) FROM sweeps WHERE name NOT IN ('budget', 'adaptive')"
SELECT_SPENT = f"""
SELECT COALESCE(SUM({_COST}), 0) FROM runs r
WHERE r.machine_id = :machine_id AND r.finished IS NOT NULL AND r.status IN ('done', 'failed', 'skipped')
AND r.job_id IN (SELECT job_id FROM sweep_jobs WHERE sweep_id = :sweep_id OR sweep_id IN
                 (SELECT sweep_id FROM budget_decisions WHERE budget_id = :budget_id AND sweep_id IS NOT NULL))
"""
SELECT_DECIDING = "SELECT COALESCE(SUM(decide_s), 0) FROM budget_decisions WHERE budget_id = :budget_id"
SELECT_JOB_KEYS = "SELECT job_id, config, block FROM jobs WHERE job_id IN ({ids})"
INSERT_DECISION = """
INSERT INTO budget_decisions (budget_id, decision, spent_s, budget_s, repeat, jobs, predicted_s, sweep_id, chosen, open,
                              decide_s, created)
VALUES (:budget_id, :decision, :spent_s, :budget_s, :repeat, :jobs, :predicted_s, :sweep_id, :chosen, :open, :decide_s,
        {now})
"""
SELECT_DECISIONS = """
SELECT b.machine_id, b.budget_id, b.budget_s, d.decision, d.spent_s, d.repeat, d.jobs, d.predicted_s, d.chosen, d.open
FROM budget_decisions d JOIN budgets b ON b.budget_id = d.budget_id ORDER BY d.decision_id
"""

@dataclass
class Budget:
    budget_id: int
    machine_id: int
    sweep_id: int
    budget_s: float


def begin(store: Store, machine_id: int, budget_s: float, sweep_id: int | None = None) -> Budget:
    """The budget of `sweep_id` (else the newest sweep a user enqueued) on the machine: made on first
    use; asked again with another length, its length changes and what was spent stays spent."""
    with store.transaction(write=True) as conn:
        if sweep_id is None:
            sweep_id = conn.execute(text(SELECT_NEWEST_SWEEP)).scalar_one_or_none()
            if sweep_id is None:
                raise BadInput("--budget: nothing was enqueued yet, so there is no sweep to spend it on")
        params = {"machine_id": machine_id, "sweep_id": sweep_id}
        row = conn.execute(text(SELECT_BUDGET), params).one_or_none()
        if row is None:
            conn.execute(store.sql(INSERT_BUDGET), params | {"budget_s": budget_s})
            row = conn.execute(text(SELECT_BUDGET), params).one()
        elif row[1] != budget_s:
            conn.execute(text(UPDATE_BUDGET), {"budget_id": row[0], "budget_s": budget_s})
    return Budget(int(row[0]), machine_id, int(sweep_id), float(budget_s))


def spent_s(store: Store, budget: Budget) -> float:
    """Seconds spent so far: the budget's runs (its sweep's and those it added), claim to finish,
    and its decisions."""
    params = {"machine_id": budget.machine_id, "sweep_id": budget.sweep_id, "budget_id": budget.budget_id}
    with store.transaction() as conn:
        return float(conn.execute(text(SELECT_SPENT), params).scalar_one()) + \
            float(conn.execute(text(SELECT_DECIDING), params).scalar_one())


@dataclass
class Decision:
    decision: str  # 'added runs' | 'spent' | 'resolved'
    spent_s: float
    budget_s: float
    repeat: int | None = None
    jobs: int = 0
    predicted_s: float = 0.0
    chosen: list[dict] = field(default_factory=list)  # what, half_width (None: no interval), runs, why
    open: list[dict] = field(default_factory=list)  # still wider than NARROW and unresolved

    @property
    def added(self) -> bool:
        return self.decision == "added runs" and self.jobs > 0

    def words(self) -> str:
        head = f"budget {_clock(self.spent_s)} of {_clock(self.budget_s)} spent"
        if self.decision == "added runs":
            names = ", ".join(c["what"] for c in self.chosen[:4]) + (
                f" and {len(self.chosen) - 4} more" if len(self.chosen) > 4 else "")
            return (f"{head}: {self.jobs} runs added (about {_clock(self.predicted_s)}) for {len(self.chosen)} "
                    f"comparison(s): {names}")
        if self.decision == "resolved":
            return f"{head}: every comparison resolved or within +-{NARROW * 100:g}%"
        return f"{head}: the budget is spent; {len(self.open)} comparison(s) still unresolved"


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


def what(e: fx.Effect) -> str:
    return f"{e.variable} power law" if e.kind == "elasticity" else f"{e.variable}={e.value} vs {e.baseline}"


def needs_runs(e: fx.Effect) -> str | None:
    """Why one more run a side would help this comparison (in words), or None: narrow enough,
    resolved, or untestable for a reason runs cannot change."""
    if e.se is None:
        if e.why_untested and ("ran once" in e.why_untested or "repeated" in e.why_untested):
            return "no interval yet"
        return None
    if e.half_width <= NARROW:
        return None
    if abs(e.log_effect) > RESOLVED_MARGIN * e.half_log:  # (log ratio, or exponent: no change is 0)
        return None
    return f"+-{e.half_width * 100:.0f}% with {e.min_runs} run(s) a side"


def gain(e: fx.Effect) -> float:
    """How much one more run a side should narrow the shown interval (relative half-width); a
    comparison without an interval counts as +-100% narrowed to nothing."""
    if e.se is None:
        return 1.0
    n = max(1, e.min_runs)
    return e.half_width * (1.0 - math.sqrt(n / (n + 1)))


def _job_keys(store: Store, job_ids: list[int]) -> dict[int, tuple]:
    """job_id -> (its configuration without the repeat, its block): the jobs one more pass repeats."""
    keys = {}
    with store.transaction() as conn:
        for start in range(0, len(job_ids), 500):
            ids = ", ".join(str(int(j)) for j in job_ids[start:start + 500])
            for job_id, config, block in conn.execute(text(SELECT_JOB_KEYS.format(ids=ids))).all():
                keys[int(job_id)] = (V.canonical_json(V.complete(json.loads(config)) | {"repeat": 0}), block)
    return keys


def choose(effects: list[fx.Effect], keys: dict[int, tuple], cost: dict[tuple, float], room_s: float,
           batch_s: float) -> tuple[list[fx.Effect], set[tuple]]:
    """Greedy by narrowing per second: the comparisons to give one more run a side and the job keys
    that gives them, predicted to cost at most room_s; stops once batch_s is reached, except that
    the comparisons without an interval all go together (none can be judged before)."""
    def key_set(e):
        return own_keys([keys[j] for j in _ids(e) if j in keys])

    def seconds(ks):
        return sum(cost.get(k, 0.0) for k in ks)

    ranked = sorted(effects, key=lambda e: (-gain(e) / max(seconds(key_set(e)), 1e-3), what(e)))
    chosen, taken, spent = [], set(), 0.0
    for e in ranked:
        new = key_set(e) - taken
        if not new:
            if key_set(e):
                chosen.append(e)  # its jobs already go: it gets its runs for free
            continue
        extra = seconds(new)
        if spent + extra > room_s:
            continue
        if spent >= batch_s and e.se is not None:
            break
        chosen.append(e)
        taken |= new
        spent += extra
    return chosen, taken


def own_keys(ks: list[tuple]) -> set[tuple]:
    """Of the (configuration, block) keys a comparison rests on, those one more run a side needs: the
    blocks where it compares two configurations or more (its values beside their own baseline). A
    baseline is fitted from its runs in every block of the pass, but another variable's block holds
    nothing of this comparison to narrow but that baseline, and repeating it there would cost a whole
    pass. Without blocks (grid sweeps: block None) every key."""
    ks = set(ks)
    configs: dict = defaultdict(set)
    for config, block in ks:
        configs[stretch_of(block)].add(config)
    mine = {stretch for stretch, cs in configs.items() if len(cs) >= 2}
    return {k for k in ks if stretch_of(k[1]) in mine} if mine else ks


def _ids(e: fx.Effect) -> list[int]:
    return [int(j) for j in (e.job_ids.tolist() if hasattr(e.job_ids, "tolist") else e.job_ids)]


def next_runs(store: Store, budget: Budget, *, add: bool = True) -> Decision:
    """Decide, record and enqueue (see the module's docstring); with add=False (the budget is spent)
    only record where the comparisons stand."""
    began = time.monotonic()
    spent = spent_s(store, budget)
    decision, sweep_id = plan(store, budget.machine_id, budget.budget_s, spent,
                              lambda ids: job_costs(store, budget.machine_id, ids), add=add,
                              label=f"budget {budget.budget_id} (machine {budget.machine_id}, sweep {budget.sweep_id})")
    return _record(store, budget, decision, sweep_id, time.monotonic() - began)


def plan(store: Store, machine_id: int, budget_s: float, spent: float, costs, *, label: str,
         add: bool = True) -> tuple[Decision, int | None]:
    """The decision for a machine that has spent `spent` of `budget_s` seconds, the chosen runs
    enqueued as the next repeat pass; `costs(job_ids)` -> {job_id: predicted seconds}. With the
    sweep row of the added jobs (None when none was added)."""
    with store.transaction() as conn:
        rows = [dict(r._mapping) for r in conn.execute(text(SELECT_ROWS), {"machine_id": machine_id})]
        noise = quiet_probe_cv(*conn.execute(text(SELECT_NOISE), {"machine_id": machine_id}).one())
        top = conn.execute(text(SELECT_MAX_REPEAT)).scalar_one_or_none()
    analysis = fx.analyse(rows, [machine_id], probe_cv={machine_id: float(noise)} if noise is not None else None)
    wanting = [(e, why) for e in analysis.effects if (why := needs_runs(e)) is not None]
    listed = [{"what": what(e), "half_width": e.half_width, "runs": e.min_runs, "why": why} for e, why in wanting]
    if not add:  # the budget ran out (with queued jobs it never reached, perhaps): say where things stand
        return Decision("spent", spent, budget_s, open=listed), None
    if not wanting:
        return Decision("resolved", spent, budget_s, open=listed), None
    keys = _job_keys(store, sorted({j for e, _ in wanting for j in _ids(e)}))
    first = {}
    for job_id, key in sorted(keys.items()):
        first.setdefault(key, job_id)
    per_job = costs(sorted(first.values()))
    cost = {key: per_job.get(job_id, 0.0) for key, job_id in first.items()}
    room = budget_s - spent if add else 0.0
    chosen, taken = choose([e for e, _ in wanting], keys, cost, room, max(MIN_BATCH_S, BATCH_SHARE * spent))
    if not taken:
        return Decision("spent", spent, budget_s, open=listed), None
    repeat = (int(top) + 1) if top is not None else 0
    jobs = repeat_jobs(store, sorted(first[k] for k in taken), repeat)
    whys = dict((what(e), why) for e, why in wanting)
    picked = [{"what": what(e), "half_width": e.half_width, "runs": e.min_runs, "why": whys[what(e)]} for e in chosen]
    result = store.enqueue(name=SWEEP_NAME, source=f"--budget: {label}",
                           sweep_text=f"{label} pass {repeat}\n" + "\n".join(p["what"] for p in picked),
                           jobs=jobs, notes=[f"repeat pass {repeat} added by --budget"])
    return Decision("added runs", spent, budget_s, repeat, result.new, sum(cost[k] for k in taken), picked,
                    listed), result.sweep_id


def _record(store: Store, budget: Budget, d: Decision, sweep_id: int | None, decide_s: float) -> Decision:
    with store.transaction(write=True) as conn:
        conn.execute(store.sql(INSERT_DECISION), {
            "budget_id": budget.budget_id, "decision": d.decision, "spent_s": d.spent_s, "budget_s": d.budget_s,
            "repeat": d.repeat, "jobs": d.jobs, "predicted_s": d.predicted_s, "sweep_id": sweep_id,
            "chosen": json.dumps(d.chosen), "open": json.dumps(d.open), "decide_s": decide_s})
    d.spent_s += decide_s
    return d


def decisions(conn) -> dict[int, list[dict]]:
    """machine_id -> its budget decisions in order, as dicts (chosen and open parsed): the report's read."""
    out: dict[int, list[dict]] = {}
    for r in conn.execute(text(SELECT_DECISIONS)).all():
        m = dict(r._mapping)
        m["chosen"], m["open"] = json.loads(m["chosen"]), json.loads(m["open"])
        out.setdefault(int(m["machine_id"]), []).append(m)
    return out


GIVEN_HEADER = ["comparison", "extra passes", "why at the first", "now", "runs a side"]


def spending(effects: list[fx.Effect], made: list[dict]) -> dict:
    """How a machine's budget was spent, for the report's two writers: `words` (the budget, what was
    spent, how it ended), `given` (rows under GIVEN_HEADER: the comparisons given extra passes) and
    `still` (the comparisons still unresolved, in words; "" where none)."""
    last = made[-1]
    added = [d for d in made if d["decision"] == "added runs"]
    ending = {"spent": "the budget was spent", "resolved": "every comparison was resolved or narrow enough",
              "added runs": "runs were still being added"}[last["decision"]]
    words = (f"Budget {_minutes(last['budget_s'])}, spent {_minutes(last['spent_s'])} (each run claim to finish, "
             f"and the decisions): one pass of every comparison first, then {sum(d['jobs'] for d in added)} runs "
             f"in {len(added)} more pass(es) where one more run a side narrowed an interval most per second; "
             f"it ended because {ending}.")
    whys: dict[str, list[str]] = {}
    for d in added:
        for c in d["chosen"]:
            whys.setdefault(c["what"], []).append(c["why"])
    by_what = {what(e): e for e in effects}
    given = []
    for name, why in sorted(whys.items(), key=lambda kv: -len(kv[1])):
        e = by_what.get(name)
        now = "-" if e is None or e.se is None else f"+-{e.half_width * 100:.1f}%"
        given.append([name, str(len(why)), why[0], now, "-" if e is None else str(e.min_runs)])
    open_ = [(e, why) for e in effects if (why := needs_runs(e)) is not None]
    still = ""
    if open_:
        still = (f"Still unresolved and wider than +-{NARROW * 100:g}%: "
                 + "; ".join(f"{what(e)} ({why}" + (f", about {e.repeats_needed} runs a side would resolve it"
                                                    if e.repeats_needed and e.repeats_needed <= fx.MAX_REPEATS_SAID
                                                    else "") + ")" for e, why in open_[:12])
                 + (f"; and {len(open_) - 12} more" if len(open_) > 12 else "")
                 + ". A longer `--budget` continues where this one stopped.")
    return {"words": words, "given": given, "still": still}


def _minutes(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s"
