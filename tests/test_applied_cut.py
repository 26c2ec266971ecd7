"""orchestrator/stats/applied_cut.py: what the report keeps of each run's `applied` reads as the whole text
does, for every key the report reads, and the report written from the cut is the report written from
the whole texts; a run's runs.applied_read (those keys, stored apart when it finished) cuts as its whole
text, and the report reads it only where it holds this release's keys."""

from __future__ import annotations

import json
import math
import random

import pytest
from sqlalchemy import text

from common.metrics import DISTURBED_FLOOR_S
from orchestrator.stats import applied_cut
from orchestrator.stats import ran
from orchestrator.report import write_report
from orchestrator.report.rows import read_results
from orchestrator.queue.store import Store
from orchestrator.report.view_sql import REPORT_LEAVES
from tests.reportdb import configs, enqueue, machine_facts, run_all

REAL = {"affinity": [0, 1], "allocator_lib": None, "blas": "mkl", "compile": "eager", "cpus": [0, 1],
        "env": {"OMP_NUM_THREADS": "2"}, "interop_threads": 2, "mkldnn": True, "omp_num_threads": "2",
        "peak_gflops": {"basis": "GEMM peak measured on CPUs [0, 1]", "fp32": 499.7, "provisional": None},
        "setup_phases_s": {"data": 0.23, "model": 0.03}, "torch_threads": 2,
        "timed_window": {"compilations": None, "end_unix_s": 1795755858.43, "start_unix_s": 1795755858.35}}


def _texts() -> list:
    """applied texts of every shape a database may hold."""
    odd = {"ranks": [{"affinity": [7], "blas": "x"}], "blas": "openblas", "é": "\u00e9 \\u00e9 \"q\""}
    return [json.dumps(REAL), json.dumps(REAL, indent=1), json.dumps({**REAL, "allocator_lib": "/lib/libjemalloc.so"}),
            json.dumps({k: v for k, v in REAL.items() if k not in ("allocator_lib", "timed_window", "affinity")}),
            json.dumps(odd, ensure_ascii=False), json.dumps(odd),
            '{"blas": "a", "blas": "b", "torch_threads": 1e999}',  # a key twice: the last one, as json reads it
            '{"blas": "mkl", "x": NaN}',  # json reads NaN, msgspec does not: left whole
            '[1, 2]', '"text"', '{"blas": ', '', 'null', None, json.dumps({"timed_window": None, "affinity": []})]


# other_cpu_s, steal_s and cores of a run: quiet, disturbed, at the floor, and of types ran.py cannot read
FIGURES = [(None, None, None), (0.0, 0.0, 2), (DISTURBED_FLOOR_S, None, 1), (DISTURBED_FLOOR_S * 1.01, 0.0, 2),
           (5.0, None, 1), (0.0, 3.0, 4), (0.0, 0.0, 0), (0.0, 0.0, "2"), ("0.5", None, 2)]


def test_the_cut_reads_as_the_whole_applied_for_every_key_the_report_reads():
    texts = _texts()
    for other, steal, cores in FIGURES:
        cut = applied_cut.cut(texts, [other] * len(texts), [steal] * len(texts), [cores] * len(texts))
        for whole, part in zip(texts, cut):
            a, b = ran._applied_of([whole])[0], ran._applied_of([part])[0]
            if not isinstance(a, dict):  # not an object: left as it was
                assert part == whole
                continue
            for key in applied_cut.READ_KEYS:
                assert (key in a, a.get(key)) == (key in b, b.get(key)), (whole, key)
            row = {"other_cpu_s": other, "steal_s": steal, "cores": cores, "train_s": 0.05, "applied": part}
            try:
                expected = ran._disturbance({**row, "applied": whole}, a)
            except (TypeError, ValueError) as e:  # a figure ran.py cannot read fails alike on the cut
                expected = type(e)
            try:
                got = ran._disturbance(row, b)
            except (TypeError, ValueError) as e:
                got = type(e)
            assert got == expected, (whole, other, steal, cores)
            assert ran.peak_of(row) == ran.peak_of({"applied": whole})
            quiet = ran.surely_quiet(other, steal, cores)
            assert ("timed_window" in b) == ("timed_window" in a and not quiet)
    assert applied_cut.cut(texts[7:8])[0] is texts[7] and applied_cut.cut([None]) == [None]


def test_a_runs_read_text_cuts_as_its_whole_applied():
    """read_text keeps every key the cut reads, as written (a key twice: the last; 1e999; non-ASCII), behind
    READ_PREFIX; a text msgspec does not read as an object has none (the report reads it whole)."""
    texts = _texts()
    read = [applied_cut.read_text(t) for t in texts]
    for whole, stored in zip(texts, read):
        if stored is None:
            assert applied_cut.cut([whole])[0] is whole  # left whole by the cut too
            continue
        assert stored.startswith(applied_cut.READ_PREFIX) and isinstance(json.loads(stored), dict)
        for other, steal, cores in FIGURES:
            figures = ([other], [steal], [cores])
            assert applied_cut.cut([stored], *figures) == applied_cut.cut([whole], *figures), (whole, other)
    assert [t for t, r in zip(texts, read) if r is None] == ['{"blas": "mkl", "x": NaN}', '[1, 2]', '"text"',
                                                             '{"blas": ', '', 'null', None]
    assert len(read[0]) < len(texts[0]) and "setup_phases_s" not in read[0] and "timed_window" in read[0]


def test_runs_whose_cut_is_alike_share_one_text_and_a_quiet_runs_window_is_left_out():
    texts = [json.dumps({**REAL, "timed_window": {"start_unix_s": i, "end_unix_s": i + 1.5},
                         "setup_phases_s": {"data": i}}) for i in range(100)]
    quiet = applied_cut.cut(texts, [0.0] * 100, [0.0] * 100, [2] * 100)
    assert len(set(map(id, quiet))) == 1 and "timed_window" not in quiet[0] and len(quiet[0]) < len(texts[0]) - 100
    busy = applied_cut.cut(texts, [1.0] * 100, [0.0] * 100, [2] * 100)
    assert len(set(busy)) == 100 and all(json.loads(b)["timed_window"]["start_unix_s"] == i for i, b in enumerate(busy))


def _database(path) -> Store:
    """Runs with real-shaped applied texts: each its own timed window and setup phases, one in four with
    other processes' CPU time (some disturbed, some not), a machine whose threads differ from the job's."""
    store = Store(str(path))
    rng = random.Random(3)
    for name in ("alpha", "beta"):
        m = store.register_machine(machine_facts(name, f"CPU {name}"))
        enqueue(store, configs({"d_model": 64, "n_layers": 2}, {"d_model": [64, 128], "n_layers": [1, 2, 4]},
                               repeats=4), sweep=f"s-{name}")
        count = [0]

        def outcome(c, name=name):
            count[0] += 1
            step = 0.01 * c["d_model"] ** 1.5 * c["n_layers"] * math.exp(rng.gauss(0, 0.03))
            t0 = 1795755858.0 + count[0] * 10
            applied = {**REAL, "torch_threads": 1 if name == "beta" else 2,
                       "timed_window": {"start_unix_s": t0, "end_unix_s": t0 + step * 0.05},
                       "setup_phases_s": {"data": rng.random()}}
            busy = count[0] % 4 == 0
            return "done", None, {"step_ms_median": step, "step_ms_p10": step * 0.95, "step_ms_p90": step * 1.05,
                                  "tokens_per_s": 1e5 / step, "wall_s": 2.0, "params": 1000, "train_s": step * 0.04,
                                  "other_cpu_s": (0.03 + step * 0.02 * (count[0] % 3)) if busy else 0.0,
                                  "steal_s": 0.0, "applied": applied}
        run_all(store, m, outcome)
    return store


def test_the_report_from_the_cut_is_the_report_from_the_whole_texts(tmp_path, monkeypatch):
    store = _database(tmp_path / "r.db")
    with store.transaction() as conn:
        _, rows = read_results(conn, None, leave_out=REPORT_LEAVES, cut_applied=applied_cut.cut)
    done = ran.done_runs(rows)
    disturbed = [ran.disturbed(r) for r in done]
    assert 0 < sum(d is not None for d in disturbed) < sum(r["other_cpu_s"] > DISTURBED_FLOOR_S for r in done)
    assert len({id(r["applied"]) for r in done if r["other_cpu_s"] == 0.0}) == 2  # one text a machine
    cut = write_report(store, tmp_path / "cut", plots=False)
    monkeypatch.setattr(applied_cut, "cut", lambda texts, *figures: list(texts))
    monkeypatch.setattr(applied_cut, "READ_PREFIX", '{"read_of": "another set"')  # each run's whole text
    write_report(store, tmp_path / "whole", plots=False)
    for name in ("summary.md", "results.csv"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    said = cut.summary_path.read_text()
    assert f"Disturbed runs: {sum(d is not None for d in disturbed)} of {len(done)} done runs" in said
    assert "asked for intra_threads=8 ran with intra_threads=1" in said  # beta's read-back, from the cut


def test_a_later_schemas_read_from_the_view_cuts_alike(tmp_path, monkeypatch):
    """Where read_results reads the view itself (a column it does not know), its rows hold the same cut."""
    from orchestrator.report import rows as rows_module
    from orchestrator.report.view_sql import sources

    store = _database(tmp_path / "r.db")
    with store.transaction() as conn:
        _, joined = read_results(conn, None, leave_out=REPORT_LEAVES, cut_applied=applied_cut.cut)
    monkeypatch.setattr(rows_module, "sources", lambda conn: {k: v for k, v in sources(conn).items()
                                                              if k != "tokens_per_s"})
    with store.transaction() as conn:
        _, later = read_results(conn, None, leave_out=REPORT_LEAVES, cut_applied=applied_cut.cut)
    assert not isinstance(later[0], rows_module.JoinedRow) and later == joined
    assert [r["applied"] for r in later] == [r["applied"] for r in joined] and "timed_window" in later[3]["applied"]


def _read(store, prefix=applied_cut.READ_PREFIX) -> list[dict]:
    with store.transaction() as conn:
        return read_results(conn, None, leave_out=REPORT_LEAVES, cut_applied=applied_cut.cut, read_prefix=prefix)[1]


def _stored_apart_reads_as_whole(store) -> None:
    """Every finished run's applied_read is read_text(applied); read_results reads the same rows from them as
    from the whole texts; a run whose stored text holds another set's tag, or none, is read from its whole
    text, and a run whose text holds this set's tag is read from that text."""
    with store.transaction() as conn:
        stored = conn.execute(text("SELECT run_id, applied, applied_read FROM runs WHERE status <> 'queued' "
                                   "ORDER BY run_id")).all()
    assert stored and all(read == applied_cut.read_text(applied) is not None for _, applied, read in stored)
    whole = _read(store, prefix=None)
    assert _read(store) == whole
    assert _read(store, prefix='{"read_of": "not this set"') == whole
    ids = [r[0] for r in stored]
    other_tag = '{"read_of": "not this set", "torch_threads": 7}'
    this_tag = applied_cut.READ_PREFIX + ', "torch_threads": 7}'
    with store.transaction(write=True) as conn:
        for run_id, value in ((ids[0], None), (ids[1], other_tag), (ids[2], this_tag)):
            conn.execute(text("UPDATE runs SET applied_read = :v WHERE run_id = :r"), {"v": value, "r": run_id})
    got = _read(store)
    assert got[:2] + got[3:] == whole[:2] + whole[3:]
    assert json.loads(got[2]["applied"]) == {"torch_threads": 7} != json.loads(whole[2]["applied"])


def test_a_finished_run_stores_the_keys_the_report_reads_apart_and_the_report_reads_them(tmp_path):
    _stored_apart_reads_as_whole(_database(tmp_path / "r.db"))


@pytest.mark.postgres
def test_on_postgresql_a_finished_run_stores_the_keys_the_report_reads_apart_and_the_report_reads_them(pg_db):
    _stored_apart_reads_as_whole(_database(pg_db))
