"""Quantization-aware training: fake-quantized Linear layers with a straight-through estimator.

Weights and activations are rounded to a low-bit grid in the forward pass and multiplied back by
their scale, so the matmul still runs in fp32 (a CPU has no int4/ternary GEMM in torch): the model
learns under quantization noise, it is not faster. The backward pass treats rounding as identity
(straight-through), so gradients reach the fp32 master weights.

    q8, q4   weights: per output channel, symmetric absmax; activations: per tensor, symmetric absmax
    bitnet   weights: ternary {-1, 0, 1} x per-tensor absmean scale (BitNet b1.58);
             activations: 8-bit absmax per token
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

QUANT_MODES = ("q8", "q4", "bitnet")
_EPS = 1e-8  # keeps an all-zero channel from dividing by zero


def _ste(x: torch.Tensor, xq: torch.Tensor) -> torch.Tensor:
    """xq in the forward pass, identity gradient in the backward pass.

    Written xq + (x - x) rather than x + (xq - x): the forward value is then exactly xq (the
    difference x - x.detach() is exactly zero), not xq plus rounding error off the grid."""
    return xq.detach() + (x - x.detach())


def fake_quant_symmetric(x: torch.Tensor, bits: int, dim: int | None) -> torch.Tensor:
    """Round x to a signed `bits` grid scaled by its absmax (over `dim`, or the whole tensor)."""
    qmax = 2 ** (bits - 1) - 1  # 127 for 8 bits, 7 for 4 bits
    absmax = x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)
    scale = absmax.clamp(min=_EPS) / qmax
    return (x / scale).round().clamp(-qmax - 1, qmax) * scale


def fake_quant_ternary(w: torch.Tensor) -> torch.Tensor:
    """BitNet b1.58: w / mean|w| rounded to {-1, 0, 1}, times mean|w|."""
    scale = w.abs().mean().clamp(min=_EPS)
    return (w / scale).round().clamp(-1, 1) * scale


class QuantLinear(nn.Linear):
    """nn.Linear whose matmul sees fake-quantized weights and inputs (mode: q8, q4 or bitnet)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, mode: str):
        assert mode in QUANT_MODES, mode
        super().__init__(in_features, out_features, bias=bias)
        self.mode = mode

    def quantized_weight(self) -> torch.Tensor:
        w = self.weight
        if self.mode == "bitnet":
            return _ste(w, fake_quant_ternary(w))
        bits = 8 if self.mode == "q8" else 4
        return _ste(w, fake_quant_symmetric(w, bits, dim=1))  # one scale per output channel

    def quantized_input(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "bitnet":
            return _ste(x, fake_quant_symmetric(x, 8, dim=-1))  # one scale per token
        bits = 8 if self.mode == "q8" else 4
        return _ste(x, fake_quant_symmetric(x, bits, dim=None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.quantized_input(x), self.quantized_weight(), self.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", mode={self.mode}"
