"""The model's weights as plain NumPy arrays: names, shapes and one deterministic initialisation.

Every framework starts from the arrays init_params() returns, so torch, JAX and NumPy train the
same weights from the same seed and their losses can be compared number for number. Names and
layouts are those of the torch model's state_dict (worker/trainers/torch/model.py): a Linear weight is
(out_features, in_features), the head is tied to `wte.weight` and is not a parameter of its own.

No torch here: a JAX or NumPy child imports this module without pulling torch in.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

INIT_STD = 0.02  # GPT-2: every matrix ~ N(0, 0.02)
LN_EPS = 1e-5  # torch.nn.LayerNorm's default eps; every framework normalises with it


@dataclass(frozen=True)
class Arch:
    """The shape variables of a resolved config, without torch (worker/trainers/torch/model.ModelConfig holds the
    same numbers for the torch model; tests/test_framework_agreement.py keeps the two equal)."""

    vocab_size: int
    seq_len: int
    n_layers: int
    d_model: int
    n_heads: int
    head_dim: int
    kv_heads: int
    mlp_ratio: float
    activation: str
    attention: str
    window: int
    dropout: float

    def __post_init__(self):
        assert self.n_heads % self.kv_heads == 0, "kv_heads must divide n_heads"
        assert self.activation in ("gelu", "relu", "silu", "swiglu"), self.activation
        assert self.attention in ("full", "local", "sliding"), self.attention

    @classmethod
    def from_config(cls, config: dict) -> Arch:
        return cls(**{name: config[name] for name in cls.__dataclass_fields__})

    @property
    def mlp_hidden(self) -> int:
        """As ModelConfig.mlp_hidden: swiglu's three matrices get 2/3 of the width (LLaMA's rule)."""
        if self.activation == "swiglu":
            return int(2 / 3 * self.mlp_ratio * self.d_model)
        return int(self.mlp_ratio * self.d_model)

    @property
    def q_width(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim


def param_shapes(arch: Arch) -> dict[str, tuple[int, ...]]:
    """Every trainable array by its torch state_dict name, in the state_dict's order (head excluded:
    it is wte.weight)."""
    C, hidden = arch.d_model, arch.mlp_hidden
    fc_out = 2 * hidden if arch.activation == "swiglu" else hidden
    shapes = {"wte.weight": (arch.vocab_size, C), "wpe.weight": (arch.seq_len, C)}
    for i in range(arch.n_layers):
        p = f"blocks.{i}."
        shapes[p + "ln1.weight"] = (C,)
        shapes[p + "attn.qkv.weight"] = (arch.q_width + 2 * arch.kv_width, C)
        shapes[p + "attn.proj.weight"] = (C, arch.q_width)
        shapes[p + "ln2.weight"] = (C,)
        shapes[p + "mlp.fc.weight"] = (fc_out, C)
        shapes[p + "mlp.proj.weight"] = (C, hidden)
    shapes["ln_f.weight"] = (C,)
    return shapes


def is_residual_projection(name: str) -> bool:
    """The projections that write into the residual stream: GPT-2 scales their init by 1/sqrt(2L)."""
    return name.endswith(("attn.proj.weight", "mlp.proj.weight"))


def is_gain(name: str) -> bool:
    """LayerNorm gains: initialised to one, never weight-decayed (nanoGPT: decay only what is >= 2-D)."""
    return name.endswith(("ln1.weight", "ln2.weight", "ln_f.weight"))


def init_params(config: dict) -> dict[str, np.ndarray]:
    """GPT-2's initialisation (the torch model's _init), seeded by config["seed"], as float32 arrays.

    Each array draws from its own stream, seeded by (seed, crc32 of its name): adding or removing a
    layer does not shift the numbers of the others, and no framework's global RNG is involved.
    """
    arch = Arch.from_config(config)
    params = {}
    for name, shape in param_shapes(arch).items():
        if is_gain(name):
            params[name] = np.ones(shape, np.float32)
            continue
        std = INIT_STD / math.sqrt(2 * arch.n_layers) if is_residual_projection(name) else INIT_STD
        rng = np.random.default_rng([int(config["seed"]), zlib.crc32(name.encode())])
        params[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std))
    return params


def count(params: dict[str, np.ndarray]) -> int:
    """Trainable parameters, the tied head counted once (as worker/trainers/torch/model.count_params)."""
    return sum(int(a.size) for a in params.values())


def torch_state_dict(params: dict[str, np.ndarray]) -> dict:
    """The arrays as the torch model's state_dict (head.weight tied to wte.weight), for
    `model.load_state_dict(...)`, which copies them into the model: the tensors share the arrays'
    memory (a copy of its own cost a d_model 256 model 80 ms a run on 2 busy cores). Imports torch:
    only the torch trainer and tests call it."""
    import torch

    state = {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in params.items()}
    state["head.weight"] = state["wte.weight"]
    return state


def save_params(params: dict[str, np.ndarray], folder: Path) -> Path:
    """The weights as model.npz under the torch state_dict names (written tmp + rename)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "model.tmp.npz"
    np.savez(tmp, **{k: np.asarray(v, np.float32) for k, v in params.items()})
    target = folder / "model.npz"
    tmp.replace(target)
    return target


def load_params(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as saved:
        return {k: saved[k].astype(np.float32) for k in saved.files}
