"""The torch trainer's side of the trainer contract (worker/trainers/session.py): what it does not run on
any machine, and its Session: train.py's, trained in this process by the shared loop, except a job of
ranks x nodes > 1, which distributed.py's launcher runs in ranks of their own (each a train.py Session
on its rank).

Imports nothing of torch: a skip must be fast, and the process's setup_s clock runs from its t0.
"""

from __future__ import annotations

from common.variables import is_learning
from worker.trainers.torch import train

NAME = "torch"


def unsupported(config: dict) -> str | None:
    """Why this trainer cannot run the config as asked (a recorded skip), or None."""
    if _world(config) > 1 and is_learning(config):
        return ("a learning run (max_tokens) with ranks x nodes > 1: every rank would have to evaluate alike "
                "and stop at the same step; not implemented")
    return None


class Session(train.Session):
    """train.Session, whose job of ranks x nodes > 1 runs in distributed.py's ranks (a prewarm process
    compiles alone, in one process)."""

    @classmethod
    def launch(cls, request: dict, t0: float) -> dict | None:
        if _world(request["config"]) > 1 and not request.get("prewarm_only"):
            from worker.trainers.torch import distributed

            return distributed.launch(request, t0)
        return None


def _world(config: dict) -> int:
    return config.get("ranks", 1) * config.get("nodes", 1)
