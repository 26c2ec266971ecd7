"""The report's "where does a rank's step go" (orchestrator/report/sections/parallel.py) from rows with a
known split."""

from types import SimpleNamespace

from orchestrator.report.sections import parallel as parallel_report


def row(ranks, step, allreduce, repeat=0, d_model=64):
    return {"machine_id": 1, "cores": 2, "d_model": d_model, "n_layers": 2, "n_heads": 4, "seq_len": 128,
            "batch_size": 8, "grad_accum": 1, "precision": "fp32", "framework": "torch", "ranks": ranks,
            "nodes": 1, "world_size": ranks, "step_ms_median": step, "allreduce_ms": allreduce,
            "tokens_per_s": 8 * ranks * 128 / step * 1e3, "global_batch": 8 * ranks, "repeat": repeat}


def test_a_ranks_step_splits_into_compute_and_allreduce_beside_one_rank():
    done = [row(1, 10.0, None), row(1, 12.0, None, 1), row(2, 8.0, 2.0), row(2, 9.0, 3.0, 1), row(2, 10.0, 2.5, 2),
            row(1, 50.0, None, d_model=512)]  # a shape never run with several ranks: not shown
    rows = parallel_report.breakdown(done)
    assert [(r["ranks"], r["runs"]) for r in rows] == [(1, 2), (2, 3)]
    two = rows[1]
    assert (two["step_ms"], two["allreduce_ms"], two["compute_ms"]) == (9.0, 2.5, 6.5)
    assert abs(two["allreduce_share"] - 2.5 / 9.0) < 1e-12 and rows[0]["allreduce_ms"] == 0.0
    ctx = SimpleNamespace(done=done, names={1: "vm"})
    text = "\n".join(parallel_report.markdown_section(ctx))
    assert "## Where does a rank's step go" in text
    assert "| vm | 64 x 2 | 2 | 2 x 1 | default | 3 | 9.0 | 6.5 | 2.50 | 27.8% |" in text
    assert "Where does a rank" in parallel_report.html_section(ctx)
    assert parallel_report.markdown_section(SimpleNamespace(done=done[:2], names={})) == []
