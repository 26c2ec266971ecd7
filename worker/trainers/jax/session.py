"""The JAX training child's framework half: what it cannot run, how it trains one step, its sync,
what it read back and saves. The request/result protocol and the timed loop are the harness's;
the training around the Session is worker/trainers/session.py's.

No torch: a JAX child never carries torch's OpenMP runtime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from worker.trainers.jax import runtime
from worker.trainers.params import Arch, init_params, save_params
from worker.trainers import session as shared
from worker.trainers.session import torch_only

NAME = "jax"
COMPILE = {"xla": True, "eager": False}  # compile value -> jax.jit of the whole step


def unsupported(config: dict) -> str | None:
    """Why this trainer cannot run the config as asked (a recorded skip), or None."""
    from worker.trainers.jax.model import PRECISIONS

    if config["precision"] not in PRECISIONS:
        return (f"jax trains in {', '.join(PRECISIONS)} (precision={config['precision']}: no quantization-aware "
                f"layers in the JAX model)")
    if config["compile"] not in COMPILE:
        return f"jax compiles with xla (jax.jit) or runs eager (compile={config['compile']})"
    if int(config["intra_threads"]) != int(config["cores"]):
        return (f"XLA CPU sizes its thread pool from the CPU affinity (cores={config['cores']}); "
                f"intra_threads={config['intra_threads']} cannot be set apart from it")
    return torch_only(config, NAME)


class Session(shared.Session):
    """One run: the model from the shared init (or a saved one), its optax optimizer, and the step
    (jit-compiled whole under compile=xla)."""

    framework = NAME

    def __init__(self, config: dict, lr: float, params: dict[str, np.ndarray] | None = None):
        from worker.trainers.jax.model import Trainer

        self.config = config
        self.jit = COMPILE[config["compile"]]
        self.arch = Arch.from_config(config)
        self.lr = lr
        self.trainer = Trainer(self.arch, init_params(config) if params is None else params, config["optimizer"],
                               lr, config["precision"], self.jit,
                               scheduled=config.get("lr_schedule", "constant") != "constant")
        self._steps = 0
        self.applied = {"lr": lr, "lr_schedule": config.get("lr_schedule", "constant"),
                        "param_dtype": str(self.trainer.params["wte.weight"].dtype),
                        "compute_dtype": np.dtype(self.trainer.dtype).name,
                        "compile_mode": "jax.jit(train_step, donate params and optimizer state)" if self.jit
                        else "eager (op by op, no jit)"}

    def step(self, micro_batches):
        """One optimizer step over [(inputs, targets), ...] NumPy micro-batches; the loss, NOT synced."""
        xs = np.stack([x for x, _ in micro_batches])
        ys = np.stack([y for _, y in micro_batches])
        self._steps += 1
        return self.trainer.step(xs, ys, seed=self._steps)

    def set_lr(self, factor: float) -> None:
        """lr_schedule: the next steps' learning rate, factor x the peak (harness.timed_loop)."""
        self.trainer.set_lr(self.lr * factor)

    def eval_loss(self, inputs: np.ndarray, targets: np.ndarray) -> float:
        """The mean loss of held-out windows, without dropout or an update (harness.evaluate)."""
        return self.trainer.eval_loss(inputs, targets)

    @staticmethod
    def compilations() -> int:
        """XLA compilations in this process so far (every jit and every eager op's first kernel)."""
        return runtime.compilations()

    @staticmethod
    def sync(loss) -> float:
        """Wait for the step's asynchronous work (JAX dispatch returns before XLA finishes)."""
        return float(loss.block_until_ready())

    def params(self) -> dict[str, np.ndarray]:
        return self.trainer.numpy_params()

    def gemm_format(self) -> str:
        return {"fp32": "fp32 GEMMs", "bf16": "bf16 GEMMs",
                "mixed": "bf16 GEMMs, fp32 master weights"}[self.config["precision"]]

    def read_back(self) -> dict:
        return self.applied | {"lr_last": self.trainer.lr()} | runtime.read_back(self.jit)

    @staticmethod
    def build_info() -> dict:
        return runtime.build_info()

    def save(self, folder: Path) -> Path:
        return save_params(self.params(), folder)
