"""The torch trainer's side of the trainer contract (worker/trainers/session.py): what it does not run on
any machine, and train(), which drives its own training where JAX and NumPy hand a Session to the
shared one: a job of ranks x nodes > 1 through distributed.py's launcher, any other in this process
(train.py: inductor and its caches, the GEMM route's proof, quantized and LoRA layers).

Imports nothing of torch: a skip must be fast, and the process's setup_s clock runs from its t0.
"""

from __future__ import annotations

from common.variables import is_learning

NAME = "torch"


def unsupported(config: dict) -> str | None:
    """Why this trainer cannot run the config as asked (a recorded skip), or None."""
    if _world(config) > 1 and is_learning(config):
        return ("a learning run (max_tokens) with ranks x nodes > 1: every rank would have to evaluate alike "
                "and stop at the same step; not implemented")
    return None


def train(request: dict, t0: float) -> dict:
    """One job: its ranks launched (a prewarm process compiles alone, in one process), or trained here."""
    if _world(request["config"]) > 1 and not request.get("prewarm_only"):
        from worker.trainers.torch import distributed

        return distributed.launch(request, t0)
    from worker.trainers.torch import train as one_process

    return one_process.run(request, t0=t0)


def _world(config: dict) -> int:
    return config.get("ranks", 1) * config.get("nodes", 1)
