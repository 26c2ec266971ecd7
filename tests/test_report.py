"""write_report on real SQLite files: the CSV, the markdown a newcomer reads, the PNGs, the effects table."""

import csv
import math
import random

import pytest
from sqlalchemy import text

from orchestrator.report import Report, write_report
from orchestrator.queue.store import Store
from tests.reportdb import configs, enqueue, machine_facts, metrics, run_all

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def law(c: dict) -> float:
    """A made-up machine: step time grows as d_model^1.7, bf16 doubles it."""
    return 0.01 * c["d_model"] ** 1.7 * (2.0 if c["precision"] == "bf16" else 1.0)


def sweep_db(store: Store, name: str = "alpha", *, seed: int = 0, speed: float = 1.0) -> int:
    """An OFAT sweep over d_model and precision, with a skipped allocator and one failed run."""
    m = store.register_machine(machine_facts(name, f"CPU {name}"))
    enqueue(store, configs({"d_model": 128, "precision": "fp32"},
                           {"d_model": [64, 128, 256], "precision": ["fp32", "bf16"],
                            "allocator": ["default", "tcmalloc"]},
                           repeats=3))
    rng = random.Random(seed)

    def outcome(c):
        if c["allocator"] == "tcmalloc":
            return "skipped", "allocator: libtcmalloc.so.4 not found", {}
        if c["d_model"] == 256 and c["repeat"] == 2:
            return "failed", "Traceback (most recent call last):\n  File \"x\"\nMemoryError: out of memory", {}
        return "done", None, metrics(law(c) * speed * math.exp(rng.gauss(0, 0.02)), c)
    run_all(store, m, outcome)
    return m


@pytest.fixture
def store(tmp_path):
    return Store(str(tmp_path / "results.db"))


@pytest.fixture
def report(store, tmp_path) -> Report:
    sweep_db(store)
    return write_report(store, tmp_path / "result")


def test_the_report_command_prints_everything_through_a_pipe_and_exits_0(store, tmp_path):
    """`bench.py report` ends without the interpreter's teardown (bench.end_at_once): what it printed
    still reaches a pipe whole, the page is written, and the exit code is 0."""
    from tests.conftest import bench

    sweep_db(store)
    proc = bench("report", "--db", str(tmp_path / "results.db"), "--out", str(tmp_path / "piped"), check=True)
    assert "largest effects on median step time" in proc.stdout and "d_model" in proc.stdout
    assert proc.stdout.rstrip().endswith("(works offline)")
    assert (tmp_path / "piped" / "index.html").is_file() and (tmp_path / "piped" / "results.csv").is_file()


def test_csv_has_one_row_per_claimed_run_with_the_columns_of_v_results(store, report):
    with store.transaction() as conn:
        res = conn.execute(text("SELECT * FROM v_results"))
        columns, n_runs = list(res.keys()), len(res.all())
    with report.csv_path.open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == columns
    assert len(rows) - 1 == n_runs == 15  # 5 configs x 3 repeats; queued ones never appear


def test_summary_explains_itself_and_names_every_varied_variable(report):
    md = report.summary_path.read_text()
    first_paragraph = md.split("\n\n")[1]
    assert "median step time" in first_paragraph and "relative to the baseline" in first_paragraph
    for name in ("d_model", "precision"):
        assert f"### {name}" in md
        assert f"![{name}](plots/{name}.png)" in md
    assert "step time ~ d_model^" in md
    assert "95% CI" in md and "family-wise" in md and "Bonferroni" in md and "One model per machine" in md
    method = md.split("## How the numbers were computed")[1]
    for words in ("in that variable alone", "derived", "block", "shared by all configurations",
                  "*No detectable effect*", "Ranking"):
        assert words in method


def test_failed_and_skipped_runs_are_counted_with_their_reasons(report):
    md = report.summary_path.read_text()
    assert report.counts["done"] == 11 and report.counts["failed"] == 1 and report.counts["skipped"] == 3
    assert ("skipped", "allocator: libtcmalloc.so.4 not found", 3) in report.failures
    assert ("failed", "MemoryError: out of memory", 1) in report.failures  # a traceback's last line
    assert "| skipped | allocator: libtcmalloc.so.4 not found | 3 |" in md
    assert "| failed | MemoryError: out of memory | 1 |" in md


def test_plots_are_png_images_matplotlib_can_read_back(report, tmp_path):
    import matplotlib.image

    names = {p.name for p in report.plot_paths}
    assert names == {"d_model.png", "precision.png"}
    for path in report.plot_paths:
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        assert path.stat().st_size > 20_000
        height, width, _ = matplotlib.image.imread(path).shape
        assert width > 800 and height > 300


def test_each_png_is_drawn_once_and_a_report_into_the_same_folder_draws_them_again(store, report, tmp_path):
    """The two drawers take a PNG by creating its file: a file left by the last report must not pass
    for one taken, and no PNG is drawn twice."""
    from orchestrator.report import _draw  # (the drawers' task, run here)

    stale = report.plot_paths[0]
    stale.write_bytes(b"not a png")
    again = write_report(store, tmp_path / "result")
    assert {p.name for p in again.plot_paths} == {p.name for p in report.plot_paths}
    for path in again.plot_paths:
        assert path.read_bytes()[:8] == PNG_SIGNATURE and path.stat().st_size > 20_000
    # a drawer skips a PNG another took: here every file exists, so nothing is drawn over them
    before = {p: p.stat().st_mtime_ns for p in again.plot_paths}
    _draw([("variable", None, p) for p in again.plot_paths])  # (arguments never read: every PNG is taken)
    assert {p: p.stat().st_mtime_ns for p in again.plot_paths} == before


def test_top_effects_are_ranked_by_p_value_and_carry_the_fitted_numbers(report):
    top = {e.variable: e for e in report.top_effects}
    assert (top["d_model"].kind, top["precision"].kind, top["precision"].value) == ("elasticity", "ratio", "bf16")
    assert top["d_model"].estimate == pytest.approx(1.7, rel=0.05)
    assert top["precision"].estimate == pytest.approx(2.0, rel=0.05)
    first, second = report.top_effects
    assert first.significant and second.significant and first.p_value <= second.p_value
    assert report.machines == 1


def test_effects_table_is_replaced_not_duplicated_by_a_second_report(store, report, tmp_path):
    query = text("SELECT variable, kind, value, baseline, estimate, n_runs FROM effects ORDER BY variable, value")
    with store.transaction() as conn:
        first = conn.execute(query).all()
    write_report(store, tmp_path / "again")
    with store.transaction() as conn:
        second = conn.execute(query).all()
    assert len(first) == len(second) == 4  # d_model: elasticity + 2 ratios; precision: 1 ratio
    kinds = {(r.variable, r.kind, r.value) for r in second}
    assert ("d_model", "elasticity", None) in kinds and ("precision", "ratio", "bf16") in kinds
    bf16 = next(r for r in second if r.value == "bf16")
    assert bf16.baseline == "fp32" and bf16.estimate == pytest.approx(2.0, rel=0.05) and bf16.n_runs == 6


def test_effects_table_holds_what_a_user_needs_to_query_a_comparison(store, report):
    with store.transaction() as conn:
        rows = [dict(r._mapping) for r in conn.execute(text("SELECT * FROM effects ORDER BY effect_id"))]
    assert {r["family"] for r in rows} == {4}
    for r in rows:
        assert r["se"] > 0 and r["dof"] >= 1 and 0 <= r["p_value"] <= r["p_adjusted"] <= 1
        assert bool(r["significant"]) == (r["p_adjusted"] < 0.05)
        assert r["ci_adj_low"] < r["ci_low"] <= r["estimate"] <= r["ci_high"] < r["ci_adj_high"]
        assert "one model" in r["method"] and r["n_passes"] == 3 and r["min_runs"] >= 2
        assert r["half_width"] > 0 and r["target_met"] is None
    d256 = next(r for r in rows if r["value"] == "256")
    assert d256["min_runs"] == 2  # its third run failed
    # what a user would ask: the clear effects, clearest first
    with store.transaction() as conn:
        clear = conn.execute(text("SELECT variable, value FROM effects WHERE significant ORDER BY p_adjusted")).all()
    assert ("precision", "bf16") in clear


def test_two_machines_are_compared_side_by_side_on_the_jobs_they_share(store, tmp_path):
    a = sweep_db(store, "alpha")
    b = sweep_db(store, "beta", seed=1, speed=1.5)  # same jobs, enqueued again: nothing new, run on beta

    report = write_report(store, tmp_path / "result")

    md = report.summary_path.read_text()
    assert report.machines == 2
    assert "## Machines compared" in md
    assert f"machine {b} (beta, CPU beta) takes 1.5" in md
    assert f"| machine {a} (alpha, CPU alpha) | machine {b} (beta, CPU beta) |" in md.replace(" (ms)", "")
    with store.transaction() as conn:
        per_machine = dict(conn.execute(text("SELECT machine_id, COUNT(*) FROM effects GROUP BY machine_id")).all())
    assert per_machine == {a: 4, b: 4}


def test_report_for_one_machine_leaves_the_other_machines_effects_alone(store, tmp_path):
    a = sweep_db(store, "alpha")
    b = sweep_db(store, "beta", seed=1)
    write_report(store, tmp_path / "all")

    only_a = write_report(store, tmp_path / "a", machine_id=a)

    assert only_a.machines == 1 and "## Machines compared" not in only_a.summary_path.read_text()
    with store.transaction() as conn:
        per_machine = dict(conn.execute(text("SELECT machine_id, COUNT(*) FROM effects GROUP BY machine_id")).all())
    assert per_machine == {a: 4, b: 4}


def test_a_two_variable_grid_gets_a_heat_map(store, tmp_path):
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({}, {"n_layers": [1, 2], "seq_len": [64, 128]}, repeats=2, grid=True))
    run_all(store, m, lambda c: ("done", None, metrics(c["n_layers"] * c["seq_len"] / 10, c)))

    report = write_report(store, tmp_path / "result")

    grid_png = [p for p in report.plot_paths if p.name.startswith("grid_")]
    assert [p.name for p in grid_png] == ["grid_n_layers_x_seq_len.png"]
    assert grid_png[0].read_bytes()[:8] == PNG_SIGNATURE
    assert "## Two variables varied together" in report.summary_path.read_text()


def test_the_collector_is_as_it_was_after_a_report_and_after_one_whose_analysis_failed(store, tmp_path, monkeypatch):
    """write_report pauses the cyclic collector while it analyses and freezes what it keeps: afterwards the
    collector runs again and nothing stays frozen (report --watch's garbage must be collected), also where
    the analysis raised."""
    import gc

    from orchestrator.stats import effects as fx

    sweep_db(store)
    frozen = gc.get_freeze_count()
    write_report(store, tmp_path / "result", plots=False)
    assert gc.isenabled() and gc.get_freeze_count() == frozen

    def fails(*_args, **_kwargs):
        raise RuntimeError("the analysis failed")

    monkeypatch.setattr(fx, "analyse", fails)
    with pytest.raises(RuntimeError, match="the analysis failed"):
        write_report(store, tmp_path / "again", plots=False)
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_a_cycle_the_analysis_leaves_is_freed_once_the_report_is_done(store, tmp_path, monkeypatch):
    """The analysis is frozen as made, with no collection first: a cycle it leaves (none in the reports
    measured) outlives the report's collections, and is freed once the report has unfrozen what it froze."""
    import gc
    import weakref

    from orchestrator.stats import effects as fx

    class Node:
        pass

    left = []
    analyse = fx.analyse

    def leaves_a_cycle(*args, **kwargs):
        node = Node()
        node.self = node
        left.append(weakref.ref(node))
        return analyse(*args, **kwargs)

    monkeypatch.setattr(fx, "analyse", leaves_a_cycle)
    sweep_db(store)
    write_report(store, tmp_path / "result", plots=False)
    gc.collect()
    assert left[0]() is None


def test_a_reports_rows_do_not_outlive_it(store, tmp_path):
    """What the report's parts keep between the page and summary.md (the seeds' and the ranks' sections'
    answers, the configuration numbers) is dropped when it returns: no list of its rows is left once its
    result is let go (report --watch would otherwise hold the last report's rows while it reads the next's,
    and a one-off report would free them only at the interpreter's exit)."""
    import gc

    from orchestrator.stats.columns import JoinedRow

    sweep_db(store)
    report = write_report(store, tmp_path / "result", plots=False)
    assert report.counts.get("done")
    del report
    gc.collect()
    held = [o for o in gc.get_objects() if type(o) is list and o and isinstance(o[0], JoinedRow)]
    assert held == [], f"{len(held)} lists of the report's rows outlived it"


def test_an_empty_database_gives_a_report_that_says_nothing_finished(store, tmp_path):
    report = write_report(store, tmp_path / "result")
    assert report.plot_paths == [] and report.top_effects == [] and report.machines == 0
    assert "No run has finished yet" in report.summary_path.read_text()
    assert report.csv_path.read_text().startswith("run_id,status")


@pytest.mark.postgres
def test_report_effects_and_eta_work_on_postgresql(request, tmp_path):
    from orchestrator.queue.eta import estimate_remaining_s

    try:
        url = request.getfixturevalue("pg_db")  # the shared fixture: a fresh database on a throwaway server
    except pytest.FixtureLookupError:
        pytest.skip("no PostgreSQL fixture in this checkout (tests/conftest.py)")
    store = Store(url)
    a = sweep_db(store, "alpha")
    sweep_db(store, "beta", seed=1, speed=1.5)

    write_report(store, tmp_path / "first")
    report = write_report(store, tmp_path / "result")

    assert report.machines == 2 and "## Machines compared" in report.summary_path.read_text()
    assert report.top_effects[0].estimate == pytest.approx(1.7, rel=0.05)
    with store.transaction() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM effects")).scalar_one() == 8
    enqueue(store, configs({"d_model": 512}, {}, repeats=2), sweep="more")
    assert estimate_remaining_s(store, a) > 0


def test_summary_states_the_machine_noise_and_where_it_comes_from(store, report, tmp_path):
    md = report.summary_path.read_text()
    noise = md.split("## How noisy the machine is")[1].split("\n## ")[0]
    assert "model's residual" in noise and "degrees of freedom" in noise and "pass drift" in noise
    # Where the machine probe measured it (machines.noise_cv, added by the machine workstream), it is used.
    with store.transaction(write=True) as conn:
        columns = [r[1] for r in conn.exec_driver_sql("PRAGMA table_info(machines)")]
        if "noise_cv" not in columns:
            conn.exec_driver_sql("ALTER TABLE machines ADD COLUMN noise_cv REAL")
        conn.exec_driver_sql("UPDATE machines SET noise_cv = 0.123")
    again = write_report(store, tmp_path / "again", plots=False).summary_path.read_text()
    assert "the machine probe measured 12%" in again


def test_asked_values_that_ran_identically_are_said_so_in_the_summary(store, tmp_path):
    m = store.register_machine(machine_facts("alpha"))
    hub = "ThomasTheMaker/Arc-Corpus-sample"
    enqueue(store, configs({"dataset": hub}, {"dataset": [hub, "builtin"], "n_layers": [1, 2]}, repeats=2))
    rng = random.Random(3)
    run_all(store, m, lambda c: ("done", None, {**metrics(10 * c["n_layers"] * math.exp(rng.gauss(0, 0.02)), c),
                                                "dataset_used": "builtin"}))

    report = write_report(store, tmp_path / "result", plots=False)

    md = report.summary_path.read_text()
    assert "**Ran identically**: `dataset`" in md and "### dataset" not in md
    assert {e.variable for e in report.effects} == {"n_layers"}


def test_disturbed_is_other_cpu_time_or_steal_above_a_share_of_the_window():
    from orchestrator.stats.effects import DISTURBED_SHARE, disturbed

    applied = '{"timed_window": {"start_unix_s": 100.0, "end_unix_s": 110.0}, "affinity": [0, 1]}'
    limit = DISTURBED_SHARE * 10.0 * 2  # 10 s on 2 CPUs
    assert disturbed({"applied": applied, "other_cpu_s": limit * 0.9, "steal_s": 0.0}) is None
    assert "other processes used" in disturbed({"applied": applied, "other_cpu_s": limit * 1.1, "steal_s": None})
    assert "hypervisor stole" in disturbed({"applied": applied, "other_cpu_s": None, "steal_s": limit * 1.1})
    # Without a window: train_s, and the job's cores. Nothing measured: nothing flagged.
    assert disturbed({"applied": None, "train_s": 10.0, "cores": 1, "other_cpu_s": limit * 0.6}) is not None
    assert disturbed({"applied": None, "train_s": 10.0, "cores": 1, "other_cpu_s": None, "steal_s": None}) is None
    # A tiny window: a few /proc/stat ticks are resolution, not disturbance.
    tiny = '{"timed_window": {"start_unix_s": 0.0, "end_unix_s": 0.05}, "affinity": [0]}'
    assert disturbed({"applied": tiny, "other_cpu_s": 0.01}) is None


def test_the_summary_counts_and_names_the_disturbed_runs(store, tmp_path):
    m = store.register_machine(machine_facts("quiet", "CPU q"))
    enqueue(store, configs({"d_model": 128}, {"d_model": [64, 128]}, repeats=3))
    seen = []

    def outcome(c):
        seen.append(c)
        fields = metrics(law(c), c) | {"train_s": 10.0, "steal_s": 0.0, "other_cpu_s": 0.1}
        if len(seen) == 2:
            fields["other_cpu_s"] = 8.0  # 10% of a 10 s window on the job's 8 cores (0.1 s: 0.1%)
        if len(seen) == 3:
            fields["applied"] = {"peak_gflops": {"fp32": 50.0, "basis": "...", "provisional": "loaded"}}
        return "done", None, fields
    run_all(store, m, outcome)
    text_ = write_report(store, tmp_path / "result", plots=False).summary_path.read_text()
    assert "Disturbed runs: 1 of 6 done runs" in text_
    assert "| 2 | other processes used 8.00 s of 8 CPU(s) x 10.00 s" in text_
    assert "MFU of 1 of 6 done runs is against a provisional GEMM peak" in text_


def test_a_simulated_precision_is_labelled_so_and_the_report_says_what_each_mode_computed(store, tmp_path):
    m = store.register_machine(machine_facts("alpha"))
    jobs = configs({"precision": "fp32"}, {"precision": ["fp32", "q4"]}, repeats=3)
    # q8 enqueues as int8 since release 6: these are the q8 jobs an older database holds
    enqueue(store, jobs + [dict(c, precision="q8") for c in jobs if c["precision"] == "fp32"])
    speed = {"fp32": 100.0, "q8": 110.0, "q4": 300.0}
    formats = {"fp32": "fp32 GEMMs", "q8": "q8 (simulated: fp32 GEMMs on fake-quantized weights and inputs)",
               "q4": "int4 weight-only x bf16 forward GEMMs (aten._weight_int4pack_mm_for_cpu), fp32 backward"}
    run_all(store, m, lambda c: ("done", None, metrics(speed[c["precision"]] * (1 + 0.01 * c["repeat"]), c)
                                 | {"gemm_format": formats[c["precision"]]}))

    report = write_report(store, tmp_path / "result")

    md = report.summary_path.read_text()
    assert "| q8 (simulated: fp32 GEMMs) |" in md and "| q8 |" not in md  # in the effect's own table
    assert f"| q4 | torch | {formats['q4']} |" in md  # what each mode computed, as its runs recorded it
    with open(report.csv_path) as f:
        rows = list(csv.DictReader(f))
    assert {r["precision"]: r["gemm_format"] for r in rows} == formats  # v_results carries the record


def test_the_machines_table_says_whether_the_probe_measured_on_a_quiet_machine(tmp_path):
    """A probe taken under load is provisional (worker/machine/probe.py): the table says so with the reason
    and its noise figure is not quoted; a quiet one says quiet, one from before the check claims neither."""
    why = "other processes used 1.20 s of 2 CPU(s) x 3.00 s while the probe measured (more than 5%: 0.30 CPU-s)"
    for facts, expected in (({"limits_disturbed": why}, f"provisional: {why}"),
                            ({"limits_disturbed": None}, "measured on a quiet machine"),
                            ({}, "load not checked")):
        store = Store(str(tmp_path / f"r{len(expected)}.db"))
        m = store.register_machine({**machine_facts("alpha"), "noise_cv": 0.52, **facts})
        enqueue(store, configs({"d_model": 64}, {"d_model": [64, 128]}, repeats=2))
        run_all(store, m, lambda c: ("done", None, metrics(0.01 * c["d_model"], c)))
        md = write_report(store, tmp_path / f"out{len(expected)}", plots=False).summary_path.read_text()
        row = next(line for line in md.splitlines() if line.startswith("| the probe's peaks and noise"))
        assert expected in row
        html = (tmp_path / f"out{len(expected)}" / "index.html").read_text()
        assert expected in html
        # a noise figure measured under load is not quoted as the machine's
        assert ("the machine probe measured 52" in md) == (expected == "measured on a quiet machine" or not facts)


def test_the_machines_table_says_which_library_gave_the_peak_mfu_is_against(store, tmp_path):
    """MFU is against the fastest GEMM library of the run's CPU set (worker/machine/gemm_peak.py); the table
    names it and the others, on the machine's largest set, beside the probe's torch-only figures."""
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"cores": 2}, {"cores": [1, 2]}, repeats=2))

    def outcome(c):
        n = c["cores"]
        peak = {"fp32": 226.0 * n, "bf16": 417.0 * n, "library": {"fp32": "jax", "bf16": "torch"},
                "by_library": {"fp32": {"jax": 226.0 * n, "torch": 103.5 * n, "numpy": 120.0 * n},
                               "bf16": {"torch": 417.0 * n, "jax": 199.0 * n}}, "basis": "...", "provisional": None}
        return "done", None, metrics(10.0 / n, c) | {"applied": {"peak_gflops": peak}}
    run_all(store, m, outcome)
    md = write_report(store, tmp_path / "result", plots=False).summary_path.read_text()
    row = next(line for line in md.splitlines() if line.startswith("| MFU is against"))
    assert "fp32 452 (jax; numpy 240, torch 207), bf16 834 (torch; jax 398) on 2 CPU(s)" in row
    assert "| GEMM fp32, torch (GFLOP/s) |" in md


@pytest.mark.parametrize("applied, expected", [
    ({"peak_gflops": {"fp32": 100.0, "basis": "probe"}}, "torch's GEMM peak (the probe's, scaled to each run's CPUs)"),
    ({"threads": 2}, "not measured"),  # an applied that records no peak
    (None, "not measured"),  # runs that record no applied at all (only runs with one are read)
])
def test_mfu_is_against_the_probes_peak_or_nothing_where_no_run_names_a_library(store, tmp_path, applied, expected):
    m = store.register_machine(machine_facts("alpha"))
    enqueue(store, configs({"cores": 2}, {"cores": [1, 2]}, repeats=2))
    extra = {"applied": applied} if applied else {}
    run_all(store, m, lambda c: ("done", None, metrics(10.0 / c["cores"], c) | extra))
    md = write_report(store, tmp_path / "result", plots=False).summary_path.read_text()
    row = next(line for line in md.splitlines() if line.startswith("| MFU is against"))
    assert expected in row
