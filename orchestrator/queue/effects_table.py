"""The effects table: a report's fitted effects kept in the database beside the runs they came from,
one row per effect; each report of a machine replaces that machine's rows whole."""

from __future__ import annotations

from sqlalchemy import text

from orchestrator.queue.store import Store

DELETE_EFFECTS = "DELETE FROM effects WHERE machine_id = :machine_id"
EFFECT_COLUMNS = ("machine_id", "variable", "kind", "value", "baseline", "estimate", "ci_low", "ci_high",
                  "ci_adj_low", "ci_adj_high", "se", "dof", "p_value", "p_adjusted", "significant", "family",
                  "method", "n_runs", "min_runs", "n_passes", "half_width", "target_met", "repeats_needed")
INSERT_EFFECT = (f"INSERT INTO effects ({', '.join(EFFECT_COLUMNS)}, created) "
                 f"VALUES ({', '.join(':' + c for c in EFFECT_COLUMNS)}, {{now}})")


def replace(store: Store, machine_ids: list[int], rows: list[dict]) -> None:
    """These machines' rows of the effects table replaced by `rows` (each with EFFECT_COLUMNS), in one
    transaction; raises the store's ReadOnlyDatabase on a read-only copy."""
    with store.transaction(write=True) as conn:
        for m in machine_ids:
            conn.execute(text(DELETE_EFFECTS), {"machine_id": m})
        if rows:
            conn.execute(store.sql(INSERT_EFFECT), rows)
