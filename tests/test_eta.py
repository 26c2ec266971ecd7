"""The ETA of the queued jobs, learned from the machine's done runs of other sizes."""

import pytest

from orchestrator.queue.eta import estimate_remaining_s, work
from orchestrator.queue.store import Store
import os

from tests.conftest import done_fields
from tests.reportdb import configs, enqueue, machine_facts, metrics, run_all

OVERHEAD_S = 3.0
S_PER_FLOP = 2e-11


def true_wall_s(c: dict) -> float:
    """The made-up machine: a fixed start-up cost plus time proportional to the training arithmetic."""
    return OVERHEAD_S + S_PER_FLOP * work(c)


def finish_as_the_law_says(c: dict):
    return "done", None, {**metrics(10.0, c), "wall_s": true_wall_s(c)}


@pytest.fixture
def store(tmp_path):
    return Store(str(tmp_path / "results.db"))


def test_no_estimate_while_nothing_is_done(store):
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({}, {"d_model": [64, 128]}, repeats=2))
    assert estimate_remaining_s(store, m) is None


def test_estimate_sums_the_fitted_time_of_each_queued_job(store):
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"d_model": 64}, {"d_model": [64, 128], "n_layers": [1, 2]}, repeats=2), sweep="small")
    run_all(store, m, finish_as_the_law_says)
    big = configs({"d_model": 256}, {"seq_len": [128, 256]}, repeats=2)
    enqueue(store, big, sweep="big")

    eta = estimate_remaining_s(store, m)

    assert eta == pytest.approx(sum(true_wall_s(c) for c in big), rel=0.01)


def test_estimate_grows_in_proportion_to_the_queued_work(store):
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"d_model": 64}, {"d_model": [64, 128]}, repeats=3), sweep="small")
    run_all(store, m, finish_as_the_law_says)
    enqueue(store, configs({"d_model": 256}, {}, repeats=4), sweep="four")
    four = estimate_remaining_s(store, m)
    enqueue(store, configs({"d_model": 256}, {}, repeats=8), sweep="eight")  # 4 more of the same size
    eight = estimate_remaining_s(store, m)

    assert four > 0
    assert eight == pytest.approx(2 * four, rel=1e-9)


def test_estimate_falls_as_queued_jobs_are_done(store):
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"d_model": 64}, {"d_model": [64, 128, 256]}, repeats=2))
    run_all(store, m, finish_as_the_law_says, limit=3)
    before = estimate_remaining_s(store, m)
    run_all(store, m, finish_as_the_law_says, limit=2)
    after = estimate_remaining_s(store, m)
    run_all(store, m, finish_as_the_law_says)

    assert before > after > 0
    assert estimate_remaining_s(store, m) == 0.0


def test_other_machines_runs_neither_count_as_done_nor_remove_queued_jobs(store):
    a = store.register_machine(machine_facts("alpha"))
    b = store.register_machine(machine_facts("beta"))
    enqueue(store, configs({"d_model": 64}, {"d_model": [64, 128]}, repeats=2))
    run_all(store, a, finish_as_the_law_says)

    assert estimate_remaining_s(store, b) is None
    assert estimate_remaining_s(store, a) == 0.0


def test_a_blocked_sweep_of_very_unequal_jobs_is_estimated_within_20_percent_from_halfway(store, tmp_path):
    """Known truth: an ofat sweep run in its blocked order, where compiling, another framework,
    emulated bf16 and skipped runs make the cost of a job nothing like its arithmetic (the work
    model alone is off by more than 2x on it). From half the sweep's time on, the ETA is the true
    remaining time to 20%: every configuration has been measured once by then."""
    import random

    from orchestrator.queue.sweep import Machine, load

    path = tmp_path / "s.toml"
    path.write_text("""
[sweep]
name = "blocked"
mode = "ofat"
repeats = 3
[base]
d_model = 64
steps = 20
[axes]
compile = ["eager", "inductor"]
framework = ["torch", "numpy"]
precision = ["fp32", "bf16"]
isa = ["default", "avx2", "avx512"]
d_model = [32, 64, 128]
n_layers = [1, 2, 4]
""")
    plan = load(path, machine=Machine(cpu_count=8))
    m = store.register_machine(machine_facts("alpha"))
    store.enqueue(name=plan.name, source="test", sweep_text=plan.text, jobs=plan.iter_jobs())
    noise = random.Random(1)

    def cost(c: dict) -> float:
        s = true_wall_s(c) + (40.0 if c["compile"] == "inductor" else 0.0)
        return s * (4.0 if c["framework"] == "numpy" else 1.0) * (6.0 if c["precision"] == "bf16" else 1.0)

    def outcome(c: dict):
        if c["isa"] != "default":  # refused at claim: costs nothing
            return "skipped", "isa cap cannot be confirmed here", {}
        return "done", None, {**metrics(10.0, c), "wall_s": cost(c) * noise.lognormvariate(0, 0.1)}

    truth_by_job = []
    while True:
        claim = store.claim(m, pid=os.getpid(), host="test-host", max_cores=8)
        if claim is None:
            break
        status, reason, fields = outcome(claim.config)
        truth_by_job.append(fields.get("wall_s", 0.0))
        store.finish(claim.run_id, pid=os.getpid(), status=status, reason=reason,
                     fields=done_fields(**fields) if status == "done" else fields)
        truth_by_job[-1] = (truth_by_job[-1], estimate_remaining_s(store, m))
    total = sum(t for t, _ in truth_by_job)
    spent, errors = 0.0, []
    for t, eta in truth_by_job:
        spent += t
        remaining = total - spent
        if spent >= total / 2 and remaining > 0:
            errors.append(abs(eta - remaining) / remaining)
    assert errors and max(errors) < 0.2, max(errors)


def test_what_a_first_run_pays_once_is_not_counted_again_for_its_repeats(store):
    """A configuration's first run may pay for what its repeats never will: the untimed compile into
    the shared cache (applied.prewarm_s) and the GEMM peak of a new CPU set (applied.peak_gflops.
    measure_s). On a 2-vCPU EPYC VM's quick sweep those were 12 s and 5 s, and the ETA counted them
    again for every repeat: 26% high at halfway."""
    m = store.register_machine(machine_facts("alpha"))
    axes = {"compile": ["eager", "inductor"]}
    enqueue(store, configs({"compile": "eager"}, axes, repeats=1), sweep="first")
    once = {"eager": (5.0, {"peak_gflops": {"fp32": 100.0, "measure_s": 5.0}}), "inductor": (12.0, {"prewarm_s": 12.0})}
    repeat_s = {"eager": 2.0, "inductor": 4.0}

    def first_runs(c):
        one_off_s, applied = once[c["compile"]]
        return "done", None, {**metrics(10.0, c), "wall_s": repeat_s[c["compile"]] + one_off_s, "applied": applied}
    assert run_all(store, m, first_runs) == 2
    enqueue(store, [c for c in configs({"compile": "eager"}, axes, repeats=3) if c["repeat"] > 0], sweep="repeats")

    assert estimate_remaining_s(store, m) == pytest.approx(2 * (2.0 + 4.0), rel=1e-6)


def test_where_the_machine_has_a_cost_model_the_eta_knows_what_flops_alone_do_not(store):
    """bf16 runs take a third of fp32's step time at the same FLOPs: FLOPs alone cannot see it (for
    the queued bf16 jobs it gives the average of the two precisions), the machine's cost model (fitted
    on its done runs' step times) does, and the ETA then uses it."""
    from common.compute import flops_per_step
    from orchestrator.queue import eta

    def step_ms(c: dict) -> float:
        return 1e3 * (1e-9 * flops_per_step(c) * (0.3 if c["precision"] == "bf16" else 1.0) + 1e-3)

    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"d_model": 64},
                           {"d_model": [32, 64, 128], "n_layers": [1, 2], "precision": ["fp32", "bf16"]},
                           repeats=2, grid=True), sweep="small")
    run_all(store, m, lambda c: ("done", None, metrics(step_ms(c), c)))
    big = configs({"d_model": 256, "n_layers": 3, "precision": "bf16"}, {"d_model": [192, 256]}, repeats=1)
    enqueue(store, big, sweep="big")
    truth = sum(metrics(step_ms(c), c)["wall_s"] for c in big)

    assert estimate_remaining_s(store, m) == pytest.approx(truth, rel=0.05)
    with store.transaction() as conn:  # the same ETA without the cost model: FLOPs alone
        from sqlalchemy import text
        finished = conn.execute(text(eta.SELECT_FINISHED.format(limit=eta.DONE_SAMPLE)),
                                {"pool_id": store.pool_id(m)}).all()
    by_flops = eta.remaining_s(eta.learn(finished), [tuple(c.get(n) for n in eta.CONFIG_NAMES) for c in big])
    assert abs(by_flops / truth - 1) > 0.15
