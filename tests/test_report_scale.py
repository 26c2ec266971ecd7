"""The report's fast path (runs grouped once per configuration: ran.as_ran's cells) says exactly what
the per-run path says, on the same databases: every effect's every number, the comparisons, what
was lost and regrouped; and the page's per-configuration shortcuts match their plain definitions."""

from __future__ import annotations

import csv
import sys
from collections import Counter, defaultdict

import pytest
from sqlalchemy import text
from threadpoolctl import threadpool_limits

from orchestrator.stats import effects as fx
from orchestrator.report.sections import seeds
from orchestrator.report.forked import Worker
from orchestrator.report import page_data
from orchestrator.report import effect_row, write_report
from orchestrator.queue.store import Store
from tests import scenarios
from tests.conftest import ROOT, wait_until
from tests.scaledb import build, configurations_a_float_apart


def _rows(store: Store) -> list[dict]:
    with store.transaction() as conn:
        result = conn.execute(text("SELECT * FROM v_results ORDER BY run_id"))
        return [dict(r._mapping) for r in result]


def _said(analysis: fx.Analysis) -> dict:
    """Everything the report takes from an analysis, as plain values."""
    out = {"family": analysis.family}
    for m, ma in analysis.machines.items():
        out[m] = {
            "effects": [effect_row(e) | {"job_ids": list(e.job_ids), "group": e.group, "log_range": e.log_range,
                                         "why": e.why_untested} for e in ma.effects],
            "levels": [[(lv.label, lv.n, sorted(lv.passes), lv.median_step_ms, lv.cv) for lv in ve.levels]
                       for ve in ma.variables],
            "fixed": [ve.fixed for ve in ma.variables], "followers": [ve.followers for ve in ma.variables],
            "left_out": [ve.left_out for ve in ma.variables],
            "interactions": [(i.statistic, i.df1, i.df2, i.p_value) for i in ma.interactions],
            "together": ma.together, "varied": ma.varied, "identical": ma.identical, "regrouped": ma.regrouped,
            "lost": [(x.variable, x.value, x.why) for x in ma.lost], "uncompared": ma.uncompared,
            "disturbed": len(ma.disturbed), "sigma2": ma.model.fit.sigma2 if ma.model else None,
            "grids": [(g.rows, g.cols, g.step_ms, g.fixed) for g in fx.grids(ma)],
        }
    return out


def _assert_same(rows: list[dict]) -> fx.Analysis:
    fast, slow = fx.analyse(rows), fx.analyse(rows, per_run=True)
    assert _said(fast) == _said(slow)
    assert fast.effects, "a comparison with nothing in it compares nothing"
    return fast


def test_a_synthetic_fleet_database_gets_the_same_effects_grouped_per_configuration_as_per_run(tmp_path):
    store = build(str(tmp_path / "r.db"), 2400, machines=2, shape="small", disturbed=23, read_back=17, quiet=True)
    rows = _rows(store)
    with threadpool_limits(1):  # as write_report computes: a dense factor's last digits follow the BLAS threads
        analysis = _assert_same(rows)
    ma = analysis.machines[min(analysis.machines)]
    assert ma.disturbed and ma.regrouped  # the awkward runs are there, and grouped alike both ways
    report = write_report(store, tmp_path / "result", plots=False)  # the report uses the fast path
    assert [effect_row(e) for e in report.effects] == [effect_row(e) for e in analysis.effects]


@pytest.mark.slow
def test_machines_whose_step_model_a_child_fitted_say_what_machines_fitted_here_say(tmp_path):
    store = build(str(tmp_path / "r.db"), 2400, machines=3, shape="small", disturbed=23, read_back=17, quiet=True)
    rows = _rows(store)
    here = fx.analyse(rows)
    with Worker() as beside:
        there = fx.analyse(rows, beside=beside)
        assert beside._pid is None  # its answer was taken: the second and third machines' fits came from it
    assert len(there.machines) == 3 and _said(there) == _said(here)


@pytest.mark.parametrize("make", [scenarios.quick, scenarios.interaction_grid, scenarios.failed_baseline,
                                  scenarios.bimodal_one_side, scenarios.drifting_pass])
def test_the_statistics_scenarios_get_the_same_effects_grouped_per_configuration_as_per_run(make):
    _assert_same(make().rows(seed=3))


def test_the_pages_baselines_and_the_seeds_lookup_match_their_plain_definitions(tmp_path):
    rows = _rows(build(str(tmp_path / "r.db"), 1500, machines=2, shape="small", read_back=11, quiet=True))
    # baselines: each configuration (config_hash) counted once, the most common label, ties to the default
    plain = {}
    by_machine: dict = defaultdict(dict)
    for r in rows:
        by_machine[r["machine_id"]].setdefault(r["config_hash"], r)
    for m, configs in by_machine.items():
        modal = {}
        for n in page_data.NAMES:
            if n in page_data.NOT_CONFIG:
                continue
            counts = Counter(page_data._val(n, c.get(n)) for c in configs.values())
            if len(counts) > 1:
                modal[n] = max(counts.items(),
                               key=lambda kv: (kv[1], str(kv[0]) == str(page_data.BY_NAME[n].default)))[0]
        plain[m] = modal
    assert page_data.baselines(rows) == plain and plain[min(plain)]
    # the runs table's configuration text: each run's own difference from its machine's baseline
    table = page_data.runs_table(rows, plain, {}, set())
    texts = table["dicts"]["config"]
    for r, ci in zip(rows, table["cols"]["config"]):
        diff = page_data.config_difference(r, plain[r["machine_id"]])
        assert texts[ci] == (", ".join(f"{k}={v}" for k, v in diff.items()) or "baseline")
    # a reference's runs: every done run that matches it (some rows made to match the first references)
    twins = [dict(r, **{k: ref.config[k] for k in seeds.MATCH_KEYS}) for ref in seeds.PUBLISHED[:3] for r in rows[:10]]
    both = rows + twins
    found = seeds.measured_all(both)
    assert found == {ref.id: seeds.measured(ref, both) for ref in seeds.PUBLISHED}
    assert sum(1 for v in found.values() if v) >= 2


@pytest.mark.slow
def test_the_compact_rows_read_like_the_full_rows_and_the_report_says_the_same_from_them(tmp_path, monkeypatch):
    """write_report reads its rows in chunks as compact rows (orchestrator/report/rows.py): every column reads
    as in the full row, results.csv is every row as fetched, and the effects (against the old per-run
    path on full rows), the cost model and the page's run table come out the same."""
    import csv
    import io
    import os

    from orchestrator.stats import cost_model as cm
    from orchestrator.report import SELECT_RESULTS
    from orchestrator.report.rows import read_rows

    store = build(str(tmp_path / "r.db"), 2400, machines=2, shape="small", disturbed=23, read_back=17, quiet=True)
    plain = _rows(store)
    with store.transaction() as conn:
        columns, rows = read_rows(conn, SELECT_RESULTS.format(where=""), {}, tmp_path / "results.csv")
    assert columns == list(plain[0]) and len(rows) == len(plain)
    assert any(v is None for v in plain[0].values())  # some columns are NULL: the compact row leaves them out
    for c, p in zip(rows, plain):
        assert dict(c) == p and {**c} == p and list(c) == list(p) and len(c) == len(p) and c == p
        assert all(c[k] == v and c.get(k) == v and k in c for k, v in p.items())
        assert all(type(c[k]) is type(v) and repr(c[k]) == repr(v) for k, v in p.items())  # shared copies alike
        assert "no such column" not in c and c.get("no such column") is None
        with pytest.raises(KeyError):
            c["no such column"]
    expected = io.StringIO(newline="")
    writer = csv.writer(expected)
    writer.writerow(columns)
    with store.transaction() as conn:
        writer.writerows(conn.execute(text(SELECT_RESULTS.format(where=""))).all())
    assert (tmp_path / "results.csv").read_bytes() == expected.getvalue().encode()
    with threadpool_limits(1):  # as write_report computes (a dense factor's last digits follow the BLAS threads)
        new, old = fx.analyse(rows), fx.analyse(plain, per_run=True)
    assert _said(new) == _said(old) and new.effects
    for m in sorted({r["machine_id"] for r in plain}):
        a, b = (cm.fit(cm.usable([r for r in rs if r["machine_id"] == m and r["status"] == "done"]))
                for rs in (rows, plain))
        assert list(a.log_costs) == list(b.log_costs) and a.factor_names == b.factor_names and a.s2 == b.s2
    report = write_report(store, tmp_path / "result", plots=False)
    assert [effect_row(e) for e in report.effects] == [effect_row(e) for e in old.effects]
    assert (tmp_path / "result" / "results.csv").read_bytes() == expected.getvalue().encode()
    with store.transaction() as conn:  # without fork, the CSV written in this process: the same bytes
        monkeypatch.delattr(os, "fork")
        again = read_rows(conn, SELECT_RESULTS.format(where=""), {}, tmp_path / "here.csv")
    assert again[1] == rows and (tmp_path / "here.csv").read_bytes() == expected.getvalue().encode()


def test_results_csv_is_written_by_the_report_where_its_child_fails_and_a_failed_report_leaves_no_child(
        tmp_path, monkeypatch):
    """write_report forks results.csv's child before the read and waits for it only before returning:
    where the child fails the report writes the same bytes itself, and a report that fails meanwhile
    kills and reaps the child (none left running, nor a zombie)."""
    import os

    import psutil

    from orchestrator.report import results_csv

    store = build(str(tmp_path / "r.db"), 600, machines=2, shape="small", quiet=True)
    expected = write_report(store, tmp_path / "ok", plots=False).csv_path.read_bytes()
    parent, write = os.getpid(), results_csv.write

    def fails_in_the_child(*args):
        if os.getpid() != parent:
            raise OSError("the child's disk is full")
        return write(*args)

    monkeypatch.setattr(results_csv, "write", fails_in_the_child)
    report = write_report(store, tmp_path / "again", plots=False)
    assert report.csv_path.read_bytes() == expected
    monkeypatch.setattr(results_csv, "write", write)

    def analysis_fails(*args, **kwargs):
        raise RuntimeError("the analysis failed")

    monkeypatch.setattr(fx, "analyse", analysis_fails)
    before = {child.pid for child in psutil.Process().children(recursive=True)}  # the suite's own, if any
    with pytest.raises(RuntimeError, match="the analysis failed"):
        write_report(store, tmp_path / "failed", plots=False)
    assert {child.pid for child in psutil.Process().children(recursive=True)} == before


def test_results_csvs_child_dies_with_a_report_killed_with_kill_9(tmp_path):
    """A report killed with kill -9 leaves no results.csv child writing for nobody (it held the pipes of
    the report's other children open, so they lived on with it: 25 s at 1M runs)."""
    import os
    import signal
    import subprocess

    import psutil

    store = build(str(tmp_path / "r.db"), 60, machines=1, shape="small", quiet=True)
    script = f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
from pathlib import Path
from orchestrator.report import rows
from orchestrator.queue.store import Store
rows._write_csv = lambda *args: time.sleep(120)  # a child still writing when its report dies
with Store({store.url!r}, read_only=True).transaction() as conn:
    child = rows.start_results_csv(conn, None, Path({str(tmp_path / "results.csv")!r}))
print(child.pid, flush=True)
time.sleep(120)
"""
    report = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(report.stdout.readline()))
        assert child.is_running() and child.ppid() == report.pid
        os.kill(report.pid, signal.SIGKILL)
        assert wait_until(lambda: report.poll() is not None, timeout=10)

        def ended() -> bool:
            try:
                return not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True
        assert wait_until(ended, timeout=10, poll_s=0.1)
    finally:
        report.kill()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_the_reports_read_joins_each_job_and_machine_once_and_gives_the_views_rows(tmp_path, request, monkeypatch,
                                                                                   backend):
    """read_results (the report's read: each run's own columns, its job's and machine's fetched once)
    gives exactly the view's rows: the same columns in the same order, each value of the same type
    and repr, read every way a dict is read; each row's own columns in the layout read_rows makes and
    its configuration's in one row that its configuration's runs share (JoinedRow), which `column` and
    `conf_values` read as the rows do; for one machine too; results.csv as the view gives it."""
    import csv
    import io
    import os

    import pickle

    from orchestrator.report import SELECT_RESULTS
    from orchestrator.report import rows as rows_module
    from orchestrator.report.forked import _dumps
    from orchestrator.report.rows import column, conf_values, present, read_results, read_rows

    monkeypatch.setattr(rows_module, "CHUNK", 97)  # several chunks (PostgreSQL: fetched ahead, FetchAhead)
    url = str(tmp_path / "r.db") if backend == "sqlite" else request.getfixturevalue("pg_db")
    store = build(url, 1200, machines=2, shape="small", disturbed=23, read_back=17, quiet=True)
    configurations_a_float_apart(store)  # (PostgreSQL's jobs keyed by their configuration's text: exact)
    with store.transaction() as conn:
        conn.execute(text("UPDATE runs SET status = 'queued' WHERE run_id IN (3, 700)"))  # not in the view
    for machine_id in (None, 2):
        where = "WHERE machine_id = :machine_id" if machine_id is not None else ""
        with store.transaction() as conn:
            result = conn.execute(text(SELECT_RESULTS.format(where=where)), {"machine_id": machine_id})
            plain = [dict(r._mapping) for r in result]
        with store.transaction() as conn:
            columns, rows = read_results(conn, machine_id, tmp_path / "results.csv")
        with store.transaction() as conn:  # the view read (read_results' fallback): PostgreSQL lost its first row
            viewed = read_rows(conn, SELECT_RESULTS.format(where=where), {"machine_id": machine_id})[1]
            assert viewed == plain
        # each row's dict as read_rows builds it of the row's own columns, to its size (read_results copies a
        # template per NULL pattern; two slots), its configuration's columns in one row its configuration's runs
        # share, and its machine's and COMMON_RUN's in one its machine's runs alike in those share
        conf, common = type(rows[0])._CONF, type(rows[0])._COMMON
        assert {"hostname", "pool", "worker_host", "gemm_format"} <= common and "machine_id" not in common
        own = [{k: v for k, v in dict.items(r) if k not in conf and k not in common} for r in viewed]
        assert [(list(dict.keys(c)), sys.getsizeof(c)) for c in rows] == [(list(o), sys.getsizeof(o) + 16) for o in own]
        for part, names in (("conf", conf), ("common", common)):
            assert [list(dict.items(getattr(c, part))) for c in rows] == [
                [(k, v) for k, v in dict.items(r) if k in names] for r in viewed]
        configurations = {tuple((k, repr(v)) for k, v in dict.items(c.conf)) for c in rows}
        assert len({id(c.conf) for c in rows}) == len(configurations) < len({c["job_id"] for c in rows})
        alike = {(c["machine_id"], tuple((k, repr(v)) for k, v in dict.items(c.common))) for c in rows}
        assert len({id(c.common) for c in rows}) == len(alike) < len(rows) / 100
        # sent to a forked child (packed as a table, or alone) they arrive whole
        assert pickle.loads(_dumps({"rows": rows[:300], "alone": (rows[7], rows[-1])})) == {
            "rows": plain[:300], "alone": (plain[7], plain[-1])}
        # 38 of 80 keys: 832 of 1,584 bytes
        assert sum(map(sys.getsizeof, rows)) < 0.6 * sum(map(sys.getsizeof, viewed))
        assert columns == list(plain[0]) and len(rows) == len(plain) > 500
        assert machine_id is None or {r["machine_id"] for r in rows} == {machine_id}
        for c, p in zip(rows, plain):
            assert c == p and list(c.items()) == list(p.items()) and len(c) == len(p) and list(c) == list(p)
            assert dict(c) == p and {**c} == p and list(c.values()) == list(p.values())
            assert c.copy() == {k: v for k, v in p.items() if v is not None} == dict(present(c))
            assert all(type(c[k]) is type(v) and repr(c[k]) == repr(v) and c.get(k) == v and k in c
                       for k, v in p.items())
            assert all(c.get(k, "x") == ("x" if v is None else v) for k, v in p.items())
            assert "no such column" not in c and c.get("no such column") is None
            with pytest.raises(KeyError):
                c["no such column"]
        for name in plain[0]:  # a column of the rows at C speed: from the rows or their configuration's
            assert column(rows, name) == [p[name] for p in plain] == column(plain, name)
            assert column(rows[:1] + plain[1:3], name) == [p[name] for p in plain[:3]]
        names = [n for n in plain[0] if n in conf][:12] + ["freq_mhz"]
        assert conf_values(rows, names) == [tuple(p[n] for n in names) for p in plain] == conf_values(plain, names)
        assert conf_values(rows, ["run_id", "d_model"]) == [(p["run_id"], p["d_model"]) for p in plain]
        expected = io.StringIO(newline="")
        writer = csv.writer(expected)
        writer.writerow(columns)
        writer.writerows(tuple(r.values()) for r in plain)
        assert (tmp_path / "results.csv").read_bytes() == expected.getvalue().encode()
        with store.transaction() as conn, monkeypatch.context() as patch:  # no fork: written here, the same
            patch.delattr(os, "fork")
            assert read_results(conn, machine_id, tmp_path / "here.csv")[1] == rows
        assert (tmp_path / "here.csv").read_bytes() == expected.getvalue().encode()


@pytest.mark.postgres
def test_on_postgresql_the_reports_read_keys_configurations_by_their_text_only_where_floats_print_exactly(
        pg_db, monkeypatch):
    """read_results on PostgreSQL reads a job's configuration as its row's text, and each configuration's
    values once (rows._view_parts: view_sql.row_text), only where the server prints each float to its last
    digit (floats_exact); with extra_float_digits at 0 it reads every job's values. The same rows either way,
    and configurations a float's last digit or 0.0's sign apart stay apart."""
    from orchestrator.report import SELECT_RESULTS
    from orchestrator.report import rows as rows_module
    from orchestrator.report.rows import read_results

    store = build(pg_db, 300, machines=2, shape="small", quiet=True)
    configurations_a_float_apart(store)
    keyed, text_of = [], rows_module.row_text
    monkeypatch.setattr(rows_module, "row_text", lambda exprs: keyed.append(1) or text_of(exprs))
    with store.transaction() as conn:
        plain = [dict(r._mapping) for r in conn.execute(text(SELECT_RESULTS.format(where="")))]
    for digits, is_keyed in ((0, False), (1, True)):
        keyed.clear()
        with store.transaction() as conn:
            conn.exec_driver_sql(f"SET LOCAL extra_float_digits = {digits}")
            rows = read_results(conn, None)[1]
        assert bool(keyed) is is_keyed
        assert [dict(r) for r in rows] == plain
        dropouts = {repr(r["dropout"]) for r in rows}
        assert {"0.3", "0.30000000000000004", "0.0", "-0.0"} <= dropouts
        assert len({id(r.conf) for r in rows}) == len({tuple(map(repr, r.conf.values())) for r in rows})


def test_jobs_share_a_configurations_row_only_where_its_values_print_alike():
    """rows._conf_rows: jobs whose configuration columns hold the same values share one row (in a later
    chunk too); values that are equal but print apart (0.0 and -0.0; 1, 1.0 and True) keep rows of
    their own, whether they meet in one chunk or in two; NULLs are left out of the row."""
    from orchestrator.report.rows import _conf_rows, row_class

    names = ["dropout", "cores", "framework", "freq_mhz"]
    Conf = row_class(names)
    confs: dict = {}

    def chunk(*jobs):
        got = _conf_rows([list(c) for c in zip(*jobs)], len(jobs), names, Conf, confs)
        assert [repr(list(dict.items(r))) for r in got] == [repr([(n, v) for n, v in zip(names, j) if v is not None])
                                                            for j in jobs]
        return got
    first = chunk((0.5, 1, "torch", None), (0.5, 2, "jax", 2000), (0.5, 1, "torch", None))
    assert first[0] is first[2] is not first[1] and first[0]["freq_mhz"] is None
    assert chunk((0.5, 2, "jax", 2000))[0] is first[1]  # a later chunk
    apart = chunk((0.0, 1, "torch", None), (-0.0, 1, "torch", None), (0.0, 1.0, "torch", None),
                  (0.0, True, "torch", None), (0.0, 1, "torch", None))
    assert apart[0] is apart[4] and len({id(r) for r in apart}) == 4
    for job in ((-0.0, 1, "torch", None), (0.0, 1.0, "torch", None), (0.0, True, "torch", None),
                (0.5, 1.0, "torch", None), (0.5, True, "torch", None), (0.5, 1.0, "jax", 2000)):
        assert chunk(job)[0] is not first[0]  # each alone in a chunk: a row of its own values (chunk() checks them)
    empty = _conf_rows([], 3, [], row_class([]), {})
    assert empty == [{}, {}, {}] and empty[0] is empty[2]


def test_runs_share_a_common_row_only_where_their_machine_and_values_print_alike():
    """rows._common_rows: runs of one machine whose common columns hold the same values share one row
    (in a later chunk too), with their machine's values; another machine's, or values that are equal but
    print apart (1, 1.0 and True; 0.0 and -0.0), have rows of their own; NULLs are left out of the row."""
    from orchestrator.report.rows import _common_rows, row_class

    Common = row_class(["hostname", "world_size", "pool"])  # the view's order: the machine's, then the runs'
    machines = {1: ((1,), ("alpha",)), 2: ((2,), ("beta",))}  # id -> (its own values, its common values)
    made: dict = {}

    def chunk(*runs):  # (machine, world_size, pool)
        got = _common_rows([m for m, *_ in runs], [list(c) for c in zip(*(r[1:] for r in runs))], machines,
                           ["world_size", "pool"], Common, made)
        assert [repr(list(dict.items(r))) for r in got] == [
            repr([(n, v) for n, v in zip(Common.COLUMNS, (machines[m][1][0], w, p)) if v is not None])
            for m, w, p in runs]
        return got
    first = chunk((1, 1, "a"), (2, 1, "a"), (1, 1, "a"), (1, None, "a"))
    assert first[0] is first[2] and len({id(r) for r in first}) == 3 and first[3]["world_size"] is None
    assert list(map(id, chunk((1, 1, "a"), (2, 1, "a")))) == list(map(id, first[:2]))  # a later chunk
    apart = chunk((1, 1, "a"), (1, 1.0, "a"), (1, True, "a"), (1, 0.0, "a"), (1, -0.0, "a"), (1, 1, "a"))
    assert apart[0] is apart[5] and len({id(r) for r in apart}) == 5
    zeros = chunk((1, 0.0, "a"), (1, -0.0, "a"), (1, 0.0, "a"))
    assert zeros[0] is zeros[2] is not zeros[1]


def test_the_pages_run_table_is_bounded_and_keeps_every_failure_and_every_drawn_run(tmp_path):
    store = build(str(tmp_path / "r.db"), 2400, machines=2, shape="small", quiet=True)
    rows = _rows(store)
    analysis = fx.analyse(rows)
    st = page_data.analysis_dicts(analysis, {m: fx.grids(a) for m, a in analysis.machines.items()}, {})
    assert page_data.page_runs(rows, st) is rows  # under RUNS_ON_PAGE: every run
    kept = page_data.page_runs(rows, st, cap=200)
    drawn = {i for v in st["variables"] for lv in v["levels"] for i in lv["run_ids"]}
    ids = {r["run_id"] for r in kept}
    not_done = {r["run_id"] for r in rows if r["status"] != "done"}
    assert not_done and not_done <= ids and drawn <= ids
    assert len(ids - not_done - drawn) <= 200 < len(rows) - len(kept)


@pytest.mark.slow
def test_the_cost_model_fitted_on_cells_says_what_the_per_run_fit_says(tmp_path):
    """cost_model.fit on (configuration, block) cells weighted by their runs (mean log time, s^2 with the
    within-cell sum of squares) against the per-run fit, on the quick preset's synthetic machine (setting
    factors, compute rates, blocks) with its passes paired so that cells hold two runs: the same
    estimates, covariance, s^2, degrees of freedom, predictions and leave-one-out."""
    import numpy as np

    from orchestrator.queue.predict import machine_rows, machines
    from orchestrator.stats import cost_model as cm
    from tests.test_cost_model import HELDOUT, build as build_quick, resolved

    store = build_quick(tmp_path / "q.db")
    rows = cm.usable(machine_rows(store, machines(store)[0].machine_id))
    rows = [dict(r, repeat=(r.get("repeat") or 0) // 2) for r in rows]  # two passes in one block
    cells = cm.Cells(rows)
    assert cells.n.max() >= 2 and len(cells.rows) < len(rows) and cells.ss.sum() > 0
    a, b = cm.fit(rows), cm.fit(rows, per_run=True)
    assert a.factors and a.rates and len(a.block_params)  # the fit has every kind of parameter
    assert np.allclose(a.params, b.params, rtol=1e-7, atol=1e-7)
    assert np.allclose(a.cov, b.cov, rtol=1e-6, atol=1e-9 * np.abs(b.cov).max())
    assert a.s2 == pytest.approx(b.s2, rel=1e-9) and a.rms_log == pytest.approx(b.rms_log, rel=1e-9)
    assert (a.dof, a.n_runs, a.n_configs) == (b.dof, b.n_runs, b.n_configs) == (b.dof, len(rows), b.n_configs)
    assert (a.factor_names, [g for g, _ in a.rates], a.reference, a.measured, a.fixed, a.ranges) == \
        (b.factor_names, [g for g, _ in b.rates], b.reference, b.measured, b.fixed, b.ranges)
    assert a.block_var == pytest.approx(b.block_var, rel=1e-6, abs=1e-12)
    for settings in HELDOUT:
        pa, pb = a.predict(resolved(**settings)), b.predict(resolved(**settings))
        assert (pa.step_ms, pa.step_ms_low, pa.step_ms_high) == pytest.approx(
            (pb.step_ms, pb.step_ms_low, pb.step_ms_high), rel=1e-8)
    new, old = cm.leave_one_config_out(rows), cm.leave_one_config_out(rows, per_run=True)
    assert [e.keys() for e in new] == [e.keys() for e in old] and any("predicted_ms" in e for e in new)
    for e, f in zip(new, old):
        assert e["config"] is f["config"] and e["runs"] == f["runs"] and e.get("refused") == f.get("refused")
        if "predicted_ms" in e:
            assert (e["predicted_ms"], e["low_ms"], e["high_ms"]) == pytest.approx(
                (f["predicted_ms"], f["low_ms"], f["high_ms"]), rel=1e-8)


@pytest.mark.slow
def test_a_watched_report_redoes_only_the_machine_whose_runs_changed_and_says_what_a_fresh_report_says(tmp_path):
    store = build(str(tmp_path / "r.db"), 2400, machines=2, shape="small", disturbed=23, read_back=17, quiet=True)
    memo: dict = {}
    write_report(store, tmp_path / "a", plots=True, memo=memo)
    first = {m: kept.analysis for m, kept in memo["effects"].items()}
    predicted = {m: entry for m, (_, entry) in memo["predictions"].items()}
    assert sorted(first) == [1, 2] and sorted(predicted) == [1, 2]
    with store.transaction() as conn:  # one of machine 2's finished runs is found to have failed
        run_id = conn.execute(text("SELECT min(run_id) FROM runs WHERE machine_id = 2 AND status = 'done'")).scalar()
        conn.execute(text("UPDATE runs SET status = 'failed', reason = 'found broken', finished = finished + 1 "
                          "WHERE run_id = :r"), {"r": run_id})
    for round_ in ("b", "c"):  # the second round reuses both machines: their kept state must be restored whole
        watched = write_report(store, tmp_path / round_, plots=True, memo=memo)
        assert memo["effects"][1].analysis is first[1] and memo["predictions"][1][1] is predicted[1]
        assert memo["effects"][2].analysis is not first[2] and memo["predictions"][2][1] is not predicted[2]
        fresh = write_report(store, tmp_path / f"{round_}-fresh", plots=True)
        assert _said(watched.analysis) == _said(fresh.analysis)
        assert ((tmp_path / round_ / "summary.md").read_text()
                == (tmp_path / f"{round_}-fresh" / "summary.md").read_text())


def test_the_reports_rows_leave_out_what_only_results_csv_and_the_facts_show_and_no_reader_asks_for_it(tmp_path,
                                                                                                       monkeypatch):
    """write_report reads each run without the columns of view_sql.REPORT_LEAVES (a run's measurements
    only results.csv shows, the machine's facts): a real run's row then stays under the 85 keys past
    which CPython doubles a dict's table. No reader of the report asks a row for one of them (asking
    raises here, in this process and in the report's children); results.csv still has every column,
    and the page and summary.md still give the machine's facts."""
    import math
    import random

    from common.metrics import METRICS
    from orchestrator.report import rows as rows_module
    from orchestrator.report import write_report
    from orchestrator.queue.store import Store
    from orchestrator.report.view_sql import REPORT_LEAVES
    from tests.reportdb import configs, enqueue, machine_facts, run_all

    store = Store(str(tmp_path / "r.db"))
    m = store.register_machine(machine_facts("alpha", "CPU alpha"))
    enqueue(store, configs({"d_model": 128, "n_layers": 2}, {"d_model": [64, 128, 256], "n_layers": [1, 2, 4]},
                           repeats=3))
    rng = random.Random(0)

    def outcome(c):  # every metric a real run records, a world of 2 ranks among them; one failure
        if c["d_model"] == 256 and c["repeat"] == 2:
            return "failed", "Traceback (most recent call last):\nMemoryError: out of memory", {}
        step = 0.01 * c["d_model"] ** 1.5 * c["n_layers"] * math.exp(rng.gauss(0, 0.02))
        fields = {name: 1.5 for name in METRICS}
        fields.update(step_ms_median=step, step_ms_p10=step * 0.95, step_ms_p90=step * 1.05, world_size=2,
                      global_batch=8, allreduce_ms=0.1 * step, allreduce_share=0.1, steal_s=0.0, other_cpu_s=0.0,
                      ctx_switches=100, params=1000, trainable_params=1000, torch_version="2.13.0",
                      python_version="3.11.7", output_path="/tmp/x", load_before=0.1, gemm_format="fp32")
        return "done", None, fields
    run_all(store, m, outcome)
    with store.transaction() as conn:
        full = [dict(r._mapping) for r in conn.execute(text("SELECT * FROM v_results ORDER BY run_id"))]
        columns, kept = rows_module.read_results(conn, None, leave_out=REPORT_LEAVES)
    done = [r for r in full if r["status"] == "done"]
    assert len([k for k, v in done[0].items() if v is not None]) > 85  # a real run's row: a doubled table
    assert columns == [c for c in full[0] if c not in REPORT_LEAVES]
    assert kept == [{k: v for k, v in r.items() if k not in REPORT_LEAVES} for r in full]
    assert max(len(dict.keys(r)) for r in kept) <= 85 and all("cpu_model" not in r for r in kept)

    def refuse(get):
        def asked(self, key, *default):
            assert key not in REPORT_LEAVES, f"a reader of the report asked a row for {key}, which it left out"
            return get(self, key, *default)
        return asked
    for cls in (rows_module.CompactRow, rows_module.JoinedRow):  # (a configuration's row and the base; a run's)
        for name in ("get", "__getitem__", "__contains__"):
            if name in vars(cls) or cls is rows_module.CompactRow:
                monkeypatch.setattr(cls, name, refuse(getattr(cls, name)))
    column = rows_module.column  # the readers of a column at C speed

    def column_refused(rows, name):
        assert name not in REPORT_LEAVES, f"a reader of the report asked the rows for {name}, which they left out"
        return column(rows, name)
    for module in (rows_module, *(m for m in sys.modules.values() if getattr(m, "column", None) is column)):
        monkeypatch.setattr(module, "column", column_refused)
    rep = write_report(store, tmp_path / "out", plots=True)
    memo: dict = {}  # report --watch's way too: a memo kept between reports
    for _ in range(2):
        write_report(store, tmp_path / "watched", plots=False, memo=memo)
    with (tmp_path / "out" / "results.csv").open() as f:
        header = next(csv.reader(f))
    assert header == list(full[0])
    assert "CPU alpha" in rep.html_path.read_text() and "| CPU | CPU alpha |" in rep.summary_path.read_text()
    assert "6.1.0-test" in rep.summary_path.read_text() and "avx512f" in rep.summary_path.read_text()


def test_a_later_schema_read_from_the_view_leaves_out_the_same_columns(tmp_path, monkeypatch):
    """read_results reads the view itself where it holds a column the read does not know (a later
    schema): the same rows, less the same columns (or none), and results.csv with every one."""
    from orchestrator.report import rows as rows_module
    from orchestrator.report.view_sql import REPORT_LEAVES, sources

    store = build(str(tmp_path / "r.db"), 300, machines=2, shape="small", quiet=True)
    with store.transaction() as conn:
        columns, joined = rows_module.read_results(conn, None, leave_out=REPORT_LEAVES)
        every, whole = rows_module.read_results(conn, None)
    monkeypatch.setattr(rows_module, "sources", lambda conn: {k: v for k, v in sources(conn).items()
                                                              if k != "tokens_per_s"})
    for leave_out, expected in ((REPORT_LEAVES, (columns, joined)), (frozenset(), (every, whole))):
        (tmp_path / "results.csv").unlink(missing_ok=True)
        with store.transaction() as conn:
            again = rows_module.read_results(conn, None, tmp_path / "results.csv", leave_out=leave_out)
            full = list(conn.execute(text("SELECT * FROM v_results WHERE 1 = 0")).keys())
        assert again == expected and "tokens_per_s" in again[0]
        assert ("cpu_model" in again[0]) == (not leave_out) and every == full
        with (tmp_path / "results.csv").open() as f:
            assert next(csv.reader(f)) == full and sum(1 for _ in f) == len(whole)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_the_reports_read_sees_one_state_of_a_database_that_a_worker_writes_between_its_statements(
        tmp_path, request, monkeypatch, backend):
    """read_results takes a report's runs, their jobs and their machines by separate statements. In the
    report's transaction (snapshot=True) a job a worker claims between them is not half seen: the runs
    are those of the moment the read began. Before, on PostgreSQL (each statement its own snapshot), the
    new run came without its job and the read died of a KeyError (report --watch, during a live sweep)."""
    from orchestrator.report import rows as rows_module
    from tests.scaledb import SHAPES, _plan

    url = str(tmp_path / "r.db") if backend == "sqlite" else request.getfixturevalue("pg_db")
    store = build(url, 120, machines=2, shape="small", quiet=True)
    fresh = [j for j in _plan(200, {**SHAPES["small"], "d_model": [512]}) if j["config"]["repeat"] == 0][:1]
    store.enqueue(name="later", source="test", sweep_text="later", jobs=fresh)  # queued: no run yet
    with store.transaction() as conn:
        before = conn.execute(text("SELECT COUNT(*) FROM v_results")).scalar()
    reads = rows_module._read
    calls = []

    def claim_between(conn, query, params):  # the jobs' statement has run, the runs' has not: a worker claims
        calls.append(1)
        if len(calls) == 2:
            assert store.claim(1, pid=1, host="elsewhere", max_cores=64) is not None
        return reads(conn, query, params)
    monkeypatch.setattr(rows_module, "_read", claim_between)
    with store.transaction(snapshot=True) as conn:
        _, rows = rows_module.read_results(conn, None)
    assert len(calls) >= 3 and len(rows) == before
    with store.transaction() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM v_results")).scalar() == before + 1
