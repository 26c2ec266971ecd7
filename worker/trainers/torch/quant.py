"""Quantized Linear layers: fake-quantized QAT modes (q8, q4, bitnet) and real int8 GEMMs (int8).

QAT (q8, q4, bitnet): fake-quantized Linear layers with a straight-through estimator.

Weights and activations are rounded to a low-bit grid in the forward pass and multiplied back by
their scale, so the matmul still runs in fp32 (a CPU has no int4/ternary GEMM in torch): the model
learns under quantization noise, it is not faster. The backward pass treats rounding as identity
(straight-through), so gradients reach the fp32 master weights.

    q8, q4   weights: per output channel, symmetric absmax; activations: per tensor, symmetric absmax
    bitnet   weights: ternary {-1, 0, 1} x per-tensor absmean scale (BitNet b1.58);
             activations: 8-bit absmax per token

int8 (Int8Linear): the forward matmul really runs in int8. Each call rounds the input to int8 with
one scale per token (absmax / 127) and the fp32 master weight to int8 with one scale per output
channel, multiplies them with torch._int_mm (int8 x int8 -> int32 accumulation; VNNI/AMX kernels
through oneDNN), and rescales the int32 result: y = (xq @ wq^T) * sx * sw. The backward runs in
fp32 on the unquantized input and master weight (straight-through: rounding counts as identity),
so the optimizer updates fp32 weights; only the forward GEMMs are int8.
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


class Int8Matmul(torch.autograd.Function):
    """x (..., in) @ w (out, in)^T with an int8 forward GEMM and an fp32 backward (see module doc)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.size(-1))
        sx = x2.abs().amax(dim=1, keepdim=True).clamp_(min=_EPS).div_(127)  # (N, 1): per token
        sw = w.abs().amax(dim=1).clamp_(min=_EPS).div_(127)  # (out,): per output channel
        xq = torch.round(x2 / sx).to(torch.int8)
        wq = torch.round(w / sw[:, None]).to(torch.int8)
        y = torch._int_mm(xq, wq.t()).float().mul_(sx).mul_(sw)  # int32 accumulation, then rescale
        ctx.save_for_backward(x, w)
        return y.view(*x.shape[:-1], w.size(0))

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        x, w = ctx.saved_tensors
        g = grad_y.reshape(-1, grad_y.size(-1))
        grad_x = (g @ w).view(x.shape) if ctx.needs_input_grad[0] else None
        grad_w = g.t() @ x.reshape(-1, x.size(-1)) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w


class Int8Linear(nn.Linear):
    """nn.Linear (no bias) whose forward matmul is a real int8 GEMM; fp32 weights and backward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.bias is None, "Int8Linear has no bias"
        return Int8Matmul.apply(x, self.weight)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", int8 forward GEMM"


def int8_gemm_peak_gflops(n: int = 2048, seconds: float = 1.0) -> float:
    """Best int8 GOP/s of an n x n x n torch._int_mm on the current threads (the int8 roofline an
    MFU of precision=int8 is measured against; the probe's fp32/bf16 GEMM peaks are the same idea)."""
    import time

    a = torch.randint(-127, 128, (n, n), dtype=torch.int8)
    b = torch.randint(-127, 128, (n, n), dtype=torch.int8).t()  # (k, n) view of an (n, k) weight, as used
    torch._int_mm(a, b)
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        torch._int_mm(a, b)
        best = max(best, 2 * n**3 / (time.perf_counter() - t) / 1e9)
    return best
