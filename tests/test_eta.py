"""The ETA of the queued jobs, learned from the machine's done runs of other sizes."""

import pytest

from orchestrator.eta import estimate_remaining_s, work
from orchestrator.store import Store
from tests.reportdb import configs, enqueue, machine_facts, metrics, run_all

OVERHEAD_S = 3.0
S_PER_FLOP = 2e-11


def true_wall_s(c: dict) -> float:
    """The made-up machine: a fixed start-up cost plus time proportional to the training arithmetic."""
    return OVERHEAD_S + S_PER_FLOP * work(c["n_layers"], c["d_model"], c["mlp_ratio"], c["vocab_size"], c["seq_len"],
                                          c["batch_size"], c["grad_accum"], c["steps"], c["warmup_steps"])


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
