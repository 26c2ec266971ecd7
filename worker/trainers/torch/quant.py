"""Quantized Linear layers: what each precision mode's GEMMs compute (docs/precision.md has the table).

    q8       simulated: fake-quantized weights and inputs, then the fp32 GEMM (QuantLinear)
    q4       real: int4 weight-only GEMM in the forward (Int4Linear)
    bitnet   real: ternary weights x int8 activations through an integer GEMM (Int8Linear, ternary)
    int8     real: int8 weights x int8 activations through an integer GEMM (Int8Linear)

Every real mode keeps fp32 master weights and an fp32 backward (straight-through: rounding counts as
identity, so the optimizer updates fp32 weights); only the forward GEMMs change format. Each forward
re-quantizes the current master weight (the weights change every step), so the rounding and packing
passes are part of the measured step. gemm_format() is the text every run records (runs.gemm_format)
and the report, v_results and the plots show.

q8 (QuantLinear): weights and activations are rounded to an 8-bit grid in the forward pass and
multiplied back by their scale, so the matmul still runs in fp32: the model learns under
quantization noise, it is not faster. Per output channel symmetric absmax for weights, per tensor for
activations.

q4 (Int4Matmul): the weight is rounded to 16 levels per group of INT4_GROUP inputs (asymmetric: a
scale and a zero per group and output channel), packed by aten._convert_weight_to_int4pack_for_cpu
and multiplied by aten._weight_int4pack_mm_for_cpu, PyTorch's CPU kernel for weight-only int4: the
activations stay bf16 (its fast path: with fp32 activations the kernel measured 10x slower than with
bf16 here) and the kernel unpacks the int4 weights inside the GEMM. The kernel needs every Linear's
output width divisible by 16 and its input width by INT4_GROUP (harness.int4_unsupported(): a config
it cannot take is refused at enqueue).

int8 and bitnet (Int8Matmul): each call rounds the input to int8 with one scale per token (absmax /
127) and the fp32 master weight to int8, multiplies them with torch._int_mm (int8 x int8 -> int32
accumulation; VNNI/AMX kernels through oneDNN where the CPU has them), and rescales the int32 result:
y = (xq @ wq^T) * sx * sw. int8: the weight gets one scale per output channel (absmax / 127).
bitnet (BitNet b1.58): the weight is ternary, w / mean|w| rounded to {-1, 0, 1}, one absmean scale
per tensor, held in int8 for the integer GEMM.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from worker.trainers.harness import INT4_GROUP

QUANT_MODES = ("q8",)  # still simulated: fake quantization, fp32 GEMMs
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
    """nn.Linear whose matmul sees fake-quantized weights and inputs (simulated modes; q4 and bitnet
    have real GEMMs in Int4Linear / Int8Linear, this fake-quantized form stays for comparison)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, mode: str):
        assert mode in ("q8", "q4", "bitnet"), mode
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


def int8_weight(w: torch.Tensor, ternary: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(wq int8 (out, in), scale): int8 per output channel (absmax / 127, scale (out,)), or BitNet
    b1.58's ternary {-1, 0, 1} with one absmean scale for the tensor (scale ())."""
    if ternary:
        sw = w.abs().mean().clamp(min=_EPS)
        return torch.round(w / sw).clamp_(-1, 1).to(torch.int8), sw
    sw = w.abs().amax(dim=1).clamp_(min=_EPS).div_(127)
    return torch.round(w / sw[:, None]).to(torch.int8), sw


def dense_backward(ctx, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(grad_x, grad_w) of y = x @ w^T in fp32 from the saved (x, w): the quantized forwards' backward
    (straight through the quantization, on the master weight; see module doc)."""
    x, w = ctx.saved_tensors
    g = grad_y.reshape(-1, grad_y.size(-1))
    grad_x = (g @ w).view(x.shape) if ctx.needs_input_grad[0] else None
    grad_w = g.t() @ x.reshape(-1, x.size(-1)) if ctx.needs_input_grad[1] else None
    return grad_x, grad_w


class Int8Matmul(torch.autograd.Function):
    """x (..., in) @ w (out, in)^T with an int8 x int8 forward GEMM and an fp32 backward (see module doc);
    ternary: the weight is BitNet's {-1, 0, 1} x absmean."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, ternary: bool = False) -> torch.Tensor:
        x2 = x.reshape(-1, x.size(-1))
        sx = x2.abs().amax(dim=1, keepdim=True).clamp_(min=_EPS).div_(127)  # (N, 1): per token
        xq = torch.round(x2 / sx).to(torch.int8)
        wq, sw = int8_weight(w, ternary)
        y = torch._int_mm(xq, wq.t()).float().mul_(sx).mul_(sw)  # int32 accumulation, then rescale
        ctx.save_for_backward(x, w)
        return y.view(*x.shape[:-1], w.size(0))

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        return (*dense_backward(ctx, grad_y), None)  # no gradient for `ternary`


class Int8Linear(nn.Linear):
    """nn.Linear (no bias) whose forward matmul is a real integer GEMM (int8 x int8; ternary: BitNet's
    {-1, 0, 1} weights); fp32 weights and backward."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *, ternary: bool = False):
        super().__init__(in_features, out_features, bias=bias)
        self.ternary = ternary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.bias is None, "Int8Linear has no bias"
        return Int8Matmul.apply(x, self.weight, self.ternary)

    def extra_repr(self) -> str:
        return super().extra_repr() + (", ternary x int8" if self.ternary else ", int8") + " forward GEMM"


def int4_pack(w: torch.Tensor, group: int = INT4_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """w (out, in) fp32 -> (packed int4 weight, scales_and_zeros (in / group, out, 2) bf16): 16 levels
    per group, w ~ (q - 8) * scale + zero (the kernel's convention)."""
    n, k = w.shape
    wg = w.detach().reshape(n, k // group, group)
    lo = wg.amin(dim=-1, keepdim=True)
    scale = (wg.amax(dim=-1, keepdim=True) - lo).clamp_(min=_EPS).div_(15)
    q = torch.round((wg - lo) / scale).clamp_(0, 15).to(torch.int32).reshape(n, k)
    zero = lo + 8 * scale
    scales_zeros = torch.cat([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1), scales_zeros


class Int4Matmul(torch.autograd.Function):
    """x (..., in) @ w (out, in)^T with an int4 weight-only forward GEMM (bf16 activations) and an
    fp32 backward on the master weight (see module doc)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        packed, scales_zeros = int4_pack(w)
        x2 = x.reshape(-1, x.size(-1)).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, packed, INT4_GROUP, scales_zeros)
        ctx.save_for_backward(x, w)
        return y.to(x.dtype).view(*x.shape[:-1], w.size(0))

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        return dense_backward(ctx, grad_y)


class Int4Linear(nn.Linear):
    """nn.Linear (no bias) whose forward matmul is PyTorch's int4 weight-only CPU GEMM."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.bias is None, "Int4Linear has no bias"
        return Int4Matmul.apply(x, self.weight)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", int4 weight-only forward GEMM (groups of {INT4_GROUP})"


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def gemm_format(precision: str, cpu_flags: set[str] | None = None) -> str:
    """What the blocks' GEMMs compute under this precision, as every run records it (runs.gemm_format).
    A simulated mode says so first; a format this CPU has no instructions for says that too."""
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    no_bf16 = "" if flags & {"avx512_bf16", "amx_bf16"} else " (no AVX512_BF16/AMX here: bf16 math in fp32 units)"
    no_vnni = "" if flags & {"avx512_vnni", "avx_vnni", "amx_int8"} else " (no VNNI/AMX here)"
    return {
        "fp32": "fp32 GEMMs",
        "bf16": "bf16 GEMMs" + no_bf16,
        "mixed": "bf16 GEMMs under autocast, fp32 master weights" + no_bf16,
        "q8": "q8 (simulated: fp32 GEMMs on fake-quantized weights and inputs)",
        "q4": "int4 weight-only x bf16 forward GEMMs (aten._weight_int4pack_mm_for_cpu), fp32 backward" + no_bf16,
        "bitnet": "ternary weights x int8 activations forward GEMMs (torch._int_mm), fp32 backward" + no_vnni,
        "int8": "int8 x int8 forward GEMMs (torch._int_mm), fp32 backward" + no_vnni,
    }[precision]


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
