"""The report's "where does a rank's step go": for data-parallel runs (ranks or nodes above 1), each
configuration's median step split into compute and gradient all-reduce, next to the same configuration
with one rank. summary.md gets markdown_section(), index.html html_section(); both read the report's
done rows (v_results) and nothing else.

    step_ms       the median over runs of step_ms_median (a run's step is its slowest rank's)
    allreduce_ms  the median over runs of allreduce_ms (a DDP comm hook: worker/trainers/torch/distributed.py)
    compute_ms    step_ms - allreduce_ms: forward, backward and optimizer, with whatever backward overlaps
                  the all-reduce counted as all-reduce
    tokens/s      every rank together (the global batch over the step)
"""

from __future__ import annotations

import html
import statistics
from collections import defaultdict

from orchestrator.report.tables import html_table, markdown_table
from orchestrator.stats.columns import column
from orchestrator.stats.config_index import kept_for_the_rows

# What makes two runs the same configuration here besides ranks/nodes (the rest is held by the sweep).
SHAPE = ("cores", "d_model", "n_layers", "n_heads", "seq_len", "batch_size", "grad_accum", "precision", "framework")


@kept_for_the_rows
def breakdown(done: list[dict]) -> list[dict]:
    """One row per (machine, shape, ranks, nodes, interconnect) among the shapes that ran with several ranks somewhere.
    Computed once for a list of rows (both writers call it); a sweep with no parallel run costs one
    C-speed look at world_size per run, and a shape is read once per run."""
    return _breakdown(done)


def _breakdown(done: list[dict]) -> list[dict]:
    if not any((w or 1) > 1 for w in set(column(done, "world_size"))):
        return []
    shapes = list(map(_shape, done))
    parallel_shapes = {s for s, r in zip(shapes, done) if (r.get("world_size") or 1) > 1}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for s, r in zip(shapes, done):
        if s in parallel_shapes and r.get("step_ms_median") is not None:
            groups[(s, r.get("ranks") or 1, r.get("nodes") or 1, r.get("interconnect") or "default")].append(r)
    rows = []
    for (shape, ranks, nodes, link), runs in sorted(groups.items(),
                                                    key=lambda kv: (str(kv[0][0]), kv[0][1], kv[0][2], kv[0][3])):
        step = statistics.median(r["step_ms_median"] for r in runs)
        reduce = [r["allreduce_ms"] for r in runs if r.get("allreduce_ms") is not None]
        allreduce = statistics.median(reduce) if reduce else 0.0
        rows.append({"machine_id": shape[0], **dict(zip(SHAPE, shape[1:])), "ranks": ranks, "nodes": nodes,
                     "interconnect": link,
                     "runs": len(runs), "step_ms": step, "allreduce_ms": allreduce, "compute_ms": step - allreduce,
                     "allreduce_share": allreduce / step if step else None,
                     "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
                     "global_batch": runs[0].get("global_batch")})
    return rows


def _shape(r: dict) -> tuple:
    return (r["machine_id"], *map(r.get, SHAPE))


HEADER = ["machine", "model (d_model x layers)", "cores", "ranks x nodes", "link between nodes", "runs", "step ms",
          "compute ms", "all-reduce ms", "all-reduce share", "tokens/s", "global batch"]


def _cells(row: dict, names: dict) -> list[str]:
    return [names.get(row["machine_id"], str(row["machine_id"])), f"{row['d_model']} x {row['n_layers']}",
            str(row["cores"]), f"{row['ranks']} x {row['nodes']}", row["interconnect"], str(row["runs"]),
            f"{row['step_ms']:.1f}",
            f"{row['compute_ms']:.1f}", f"{row['allreduce_ms']:.2f}",
            f"{row['allreduce_share']:.1%}" if row["allreduce_share"] is not None else "-",
            f"{row['tokens_per_s']:,.0f}", str(row["global_batch"] or "-")]


INTRO = ("Each rank trains its own micro-batch, then DistributedDataParallel averages the gradients over "
         "gloo; a step ends when that all-reduce does. The all-reduce time is measured by a DDP comm hook "
         "(the time some gradient bucket was in flight, from sent to reduced; backward work it overlaps "
         "counts as all-reduce), compute is the rest of the slowest rank's median step. batch_size is per rank, so "
         "tokens/s is the fair comparison between rank counts.")


def markdown_section(ctx) -> list[str]:
    rows = breakdown(ctx.done)
    if not rows:
        return []
    return (["", "## Where does a rank's step go", "", INTRO, ""]
            + markdown_table(HEADER, [_cells(r, ctx.names) for r in rows], escape=False, blank_after=False))


def html_section(ctx) -> str:
    rows = breakdown(ctx.done)
    if not rows:
        return ""
    table = html_table(HEADER, [_cells(r, ctx.names) for r in rows], None, escape=True, thead=False)
    return f'<section id="parallel"><h2>Where does a rank\'s step go</h2><p>{html.escape(INTRO)}</p>{table}</section>'
