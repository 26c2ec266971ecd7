"""The decoder of worker/trainers/torch/model.py in NumPy, forward and backward written by hand, fp32 only.

Reads bottom-up: elementwise functions, LayerNorm, attention, MLP, the whole model's loss and
gradients last. Every activation is kept flat as (N, C) with N = batch * seq_len tokens, so each
projection is one 2-D SGEMM over the whole batch (mm(): on the run's `blas` library, blas.py); attention runs as
batched GEMMs over (batch, kv head, block) with the query heads that share a K/V head stacked into
one matrix (GQA costs no copies of K and V). NumPy's elementwise ufuncs run on one thread, so the
code keeps their passes few: in-place operations, the scale folded into Q, the softmax and the
cross-entropy gradient written over their inputs, and GELU's CDF computed in cache-sized chunks.

Weights use the torch layouts of worker/trainers/params.py ((out, in) for a projection), and the
same names: `loss_and_grads` returns gradients under the parameters' names.
"""

from __future__ import annotations

import math

import numpy as np

from worker.trainers.masks import BlockLayout, block_layout
from worker.trainers.numpy import blas
from worker.trainers.params import LN_EPS, Arch

F32 = np.float32


def mm(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Every matrix product of the model: a @ b on the run's GEMM library (blas.py: OpenBLAS, MKL, BLIS)."""
    return blas.active.matmul(a, b, out)

# -- elementwise ---------------------------------------------------------------------------------

# Abramowitz & Stegun 7.1.26: erfc(z) ~ t * poly(t) * exp(-z^2), t = 1 / (1 + p z), z >= 0, absolute
# error < 1.5e-7 (measured 3e-7 on the normal CDF in fp32) -- NumPy has no erf ufunc; SciPy's runs
# in double and measured 30 ms per 2M values here, this 4x less.
_AS_P = F32(0.3275911 / math.sqrt(2))  # p / sqrt(2): applied to |x|, so that z = |x| / sqrt(2)
_AS_COEF = tuple(F32(c) for c in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592))
_CHUNK = 1 << 15  # elements per pass of the chunked kernels: 128 KiB, a few buffers fit in L2


def normal_cdf_pdf(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Phi(x) and phi(x) of the standard normal (exact GELU is x * Phi(x); its derivative
    Phi(x) + x * phi(x)), computed chunk by chunk so that the ~20 passes stay in cache."""
    cdf = np.empty_like(x)
    pdf = np.empty_like(x)
    xf, cf, pf = x.reshape(-1), cdf.reshape(-1), pdf.reshape(-1)
    t_buf = np.empty(_CHUNK, F32)
    s_buf = np.empty(_CHUNK, F32)
    for start in range(0, xf.size, _CHUNK):
        xc, c, p = xf[start:start + _CHUNK], cf[start:start + _CHUNK], pf[start:start + _CHUNK]
        t, s = t_buf[:xc.size], s_buf[:xc.size]
        np.abs(xc, out=s)
        np.multiply(s, _AS_P, out=t)
        t += F32(1)
        np.reciprocal(t, out=t)  # t = 1 / (1 + p |x| / sqrt 2)
        np.square(xc, out=p)
        p *= F32(-0.5)
        np.exp(p, out=p)  # exp(-x^2 / 2) = sqrt(2 pi) phi(x)
        np.multiply(t, _AS_COEF[0], out=c)
        for coef in _AS_COEF[1:]:
            c += coef
            c *= t
        c *= p
        c *= F32(0.5)  # Phi(-|x|) = erfc(|x| / sqrt 2) / 2
        np.greater(xc, 0, out=s, casting="unsafe")  # 1.0 where x > 0 (where= is 40x slower)
        np.multiply(c, F32(-2), out=t)
        t += F32(1)
        t *= s
        c += t  # x > 0: Phi(x) = 1 - Phi(-|x|)
        p *= F32(1 / math.sqrt(2 * math.pi))
    return cdf, pdf


def sigmoid(x: np.ndarray) -> np.ndarray:
    s = np.negative(x)
    np.exp(s, out=s)
    s += F32(1)
    return np.reciprocal(s, out=s)


def dropout_mask(rng: np.random.Generator | None, p: float, shape) -> np.ndarray | None:
    """Inverted dropout: a float32 mask of 0 and 1 / (1 - p), or None when dropout is off."""
    if rng is None or p == 0.0:
        return None
    keep = rng.random(shape, dtype=F32) >= F32(p)
    return keep.astype(F32) * F32(1 / (1 - p))


# -- LayerNorm without bias ------------------------------------------------------------------------


def layernorm(x: np.ndarray, gain: np.ndarray):
    """(N, C) -> (N, C); the cache holds the normalised input and 1 / std."""
    mean = x.mean(axis=1, keepdims=True)
    xhat = x - mean
    var = np.einsum("nc,nc->n", xhat, xhat)[:, None] / F32(x.shape[1])
    rstd = 1.0 / np.sqrt(var + F32(LN_EPS))  # (N, 1)
    xhat *= rstd
    return xhat * gain, (xhat, rstd, gain)


def layernorm_backward(dy: np.ndarray, cache, dgain: np.ndarray) -> np.ndarray:
    """dx; the gain's gradient is written into dgain."""
    xhat, rstd, gain = cache
    np.einsum("nc,nc->c", dy, xhat, out=dgain)
    dxhat = dy * gain
    C = F32(xhat.shape[1])
    mean_dxhat = dxhat.mean(axis=1, keepdims=True)
    mean_dxhat_xhat = np.einsum("nc,nc->n", dxhat, xhat)[:, None] / C
    dxhat -= mean_dxhat
    dxhat -= xhat * mean_dxhat_xhat
    dxhat *= rstd
    return dxhat


# -- attention -------------------------------------------------------------------------------------


class Attention:
    """Causal self-attention over the block layout of worker/trainers/masks.py.

    Shapes: B batch, T seq_len, KV kv_heads, R = n_heads / kv_heads query heads per K/V head,
    n query blocks of W queries (n = 1, W = T for full attention), K keys per block (W or 2W).
    Query head h uses K/V head h // R, as torch's repeat_interleave does.
    """

    def __init__(self, arch: Arch, batch: int, seq_len: int):
        self.arch = arch
        self.B, self.T = batch, seq_len
        self.layout: BlockLayout = block_layout(arch.attention, seq_len, arch.window)
        L = self.layout
        self.R = arch.n_heads // arch.kv_heads
        self.scale = F32(1.0 / math.sqrt(arch.head_dim))
        self.mask = L.additive_mask()[:, None]  # (n, 1, W, K): broadcast over the R stacked heads

    def _pad(self, x: np.ndarray) -> np.ndarray:
        """(B, T, ...) -> (B, padded T, ...), zeros at the end."""
        extra = self.layout.padded_len - self.T
        if extra == 0:
            return x
        return np.concatenate([x, np.zeros((x.shape[0], extra) + x.shape[2:], x.dtype)], axis=1)

    def q_blocks(self, q: np.ndarray) -> np.ndarray:
        """(N, n_heads * hd) -> (B, KV, n, R * W, hd)."""
        a, L = self.arch, self.layout
        q = self._pad(q.reshape(self.B, self.T, a.kv_heads, self.R, a.head_dim))
        q = q.reshape(self.B, L.n_blocks, L.block, a.kv_heads, self.R, a.head_dim)
        q = q.transpose(0, 3, 1, 4, 2, 5)  # (B, KV, n, R, W, hd)
        return np.ascontiguousarray(q).reshape(self.B, a.kv_heads, L.n_blocks, self.R * L.block, a.head_dim)

    def from_q_blocks(self, y: np.ndarray) -> np.ndarray:
        """(B, KV, n, R * W, hd) -> (N, n_heads * hd): q_blocks undone."""
        a, L = self.arch, self.layout
        y = y.reshape(self.B, a.kv_heads, L.n_blocks, self.R, L.block, a.head_dim)
        y = y.transpose(0, 2, 4, 1, 3, 5).reshape(self.B, L.padded_len, a.n_heads * a.head_dim)
        return np.ascontiguousarray(y[:, :self.T]).reshape(self.B * self.T, -1)

    def kv_blocks(self, k: np.ndarray) -> np.ndarray:
        """(N, kv_heads * hd) -> (B, KV, n, K, hd); sliding: the previous block's keys, then its own."""
        a, L = self.arch, self.layout
        k = self._pad(k.reshape(self.B, self.T, a.kv_heads, a.head_dim))
        k = k.reshape(self.B, L.n_blocks, L.block, a.kv_heads, a.head_dim).transpose(0, 3, 1, 2, 4)
        if L.key_blocks == 1:
            return np.ascontiguousarray(k)  # (B, KV, n, W, hd)
        out = np.zeros((self.B, a.kv_heads, L.n_blocks, 2 * L.block, a.head_dim), k.dtype)
        out[:, :, 1:, :L.block] = k[:, :, :-1]  # block 0 has no previous block: zeros, masked
        out[:, :, :, L.block:] = k
        return out

    def from_kv_blocks(self, dk: np.ndarray) -> np.ndarray:
        """(B, KV, n, K, hd) gradients -> (N, kv_heads * hd): a key seen by two blocks sums both."""
        a, L = self.arch, self.layout
        if L.key_blocks == 2:
            own = dk[:, :, :, L.block:].copy()
            own[:, :, :-1] += dk[:, :, 1:, :L.block]
            dk = own
        dk = dk.transpose(0, 2, 3, 1, 4).reshape(self.B, L.padded_len, a.kv_heads * a.head_dim)
        return np.ascontiguousarray(dk[:, :self.T]).reshape(self.B * self.T, -1)

    def forward(self, x: np.ndarray, w_qkv: np.ndarray, w_proj: np.ndarray, rng=None):
        a, L = self.arch, self.layout
        qw, kvw = a.q_width, a.kv_width
        qkv = mm(x, w_qkv.T)  # (N, qw + 2 kvw)
        q = qkv[:, :qw] * self.scale  # the 1/sqrt(hd) folded into Q: a pass over N x qw, not over the scores
        qb = self.q_blocks(q)  # (B, KV, n, R*W, hd)
        kb = self.kv_blocks(qkv[:, qw:qw + kvw])  # (B, KV, n, K, hd)
        vb = self.kv_blocks(qkv[:, qw + kvw:])
        s = mm(qb, kb.swapaxes(-1, -2))  # (B, KV, n, R*W, K)
        s6 = s.reshape(self.B, a.kv_heads, L.n_blocks, self.R, L.block, L.keys)
        s6 += self.mask
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s *= 1.0 / s.sum(axis=-1, keepdims=True)  # p: the attention weights
        p = s
        drop = dropout_mask(rng, a.dropout, p.shape)
        p_used = p * drop if drop is not None else p
        y = self.from_q_blocks(mm(p_used, vb))  # (N, n_heads * hd)
        out = mm(y, w_proj.T)  # (N, C)
        return out, (x, qb, kb, vb, p, drop, y)

    def backward(self, dout: np.ndarray, cache, w_qkv, w_proj, dw_qkv, dw_proj) -> np.ndarray:
        x, qb, kb, vb, p, drop, y = cache
        mm(dout.T, y, out=dw_proj)  # (C, qw)
        dyb = self.q_blocks(mm(dout, w_proj))  # (B, KV, n, R*W, hd)
        p_used = p * drop if drop is not None else p
        dvb = mm(p_used.swapaxes(-1, -2), dyb)  # (B, KV, n, K, hd)
        dp = mm(dyb, vb.swapaxes(-1, -2))  # (B, KV, n, R*W, K)
        if drop is not None:
            dp *= drop
        # softmax backward: ds = p * (dp - sum(dp * p)), written over dp
        dp -= np.einsum("...k,...k->...", dp, p)[..., None]
        dp *= p
        ds = dp
        dq = self.from_q_blocks(mm(ds, kb))
        dq *= self.scale
        dk = self.from_kv_blocks(mm(ds.swapaxes(-1, -2), qb))  # qb is already scaled
        dv = self.from_kv_blocks(dvb)
        dqkv = np.concatenate([dq, dk, dv], axis=1)  # (N, qw + 2 kvw)
        mm(dqkv.T, x, out=dw_qkv)
        return mm(dqkv, w_qkv)


# -- MLP --------------------------------------------------------------------------------------------


class MLP:
    def __init__(self, arch: Arch):
        self.activation = arch.activation
        self.hidden = arch.mlp_hidden

    def forward(self, x: np.ndarray, w_fc: np.ndarray, w_proj: np.ndarray):
        h = mm(x, w_fc.T)  # (N, hidden), or (N, 2 hidden) for swiglu
        if self.activation == "gelu":
            cdf, pdf = normal_cdf_pdf(h)
            act = h * cdf
            saved = (h, cdf, pdf)
        elif self.activation == "relu":
            act = np.maximum(h, F32(0))
            saved = (h,)
        elif self.activation == "silu":
            s = sigmoid(h)
            act = h * s
            saved = (h, s)
        else:  # swiglu: chunk(2) as torch: the first half gates, the second goes up
            gate, up = h[:, :self.hidden], h[:, self.hidden:]
            s = sigmoid(gate)
            silu = gate * s
            act = silu * up
            saved = (gate, up, s, silu)
        out = mm(act, w_proj.T)  # (N, C)
        return out, (x, act, saved)

    def backward(self, dout: np.ndarray, cache, w_fc, w_proj, dw_fc, dw_proj) -> np.ndarray:
        x, act, saved = cache
        mm(dout.T, act, out=dw_proj)
        dact = mm(dout, w_proj)  # (N, hidden)
        if self.activation == "gelu":
            h, cdf, pdf = saved
            pdf *= h
            pdf += cdf  # gelu'(h) = Phi(h) + h phi(h)
            dact *= pdf
            dh = dact
        elif self.activation == "relu":
            (h,) = saved
            dact *= h > 0
            dh = dact
        elif self.activation == "silu":
            h, s = saved
            dh = dact * silu_grad(h, s)
        else:
            gate, up, s, silu = saved
            dh = np.empty((dact.shape[0], 2 * self.hidden), F32)
            np.multiply(dact, silu, out=dh[:, self.hidden:])
            np.multiply(dact, up, out=dh[:, :self.hidden])
            dh[:, :self.hidden] *= silu_grad(gate, s)
        mm(dh.T, x, out=dw_fc)
        return mm(dh, w_fc)


def silu_grad(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """d/dx x sigmoid(x) = s (1 + x (1 - s))."""
    g = F32(1) - s
    g *= x
    g += F32(1)
    g *= s
    return g


# -- the model -------------------------------------------------------------------------------------


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean next-token cross-entropy in fp32 and its gradient, softmax - onehot over N, written over
    the logits (the largest activation: 2048 x 8192 floats at the d256 benchmark config)."""
    N = logits.shape[0]
    rows = np.arange(N)
    logits -= logits.max(axis=1, keepdims=True)
    target_logit = logits[rows, targets]
    np.exp(logits, out=logits)
    total = logits.sum(axis=1)
    loss = float(np.mean(np.log(total) - target_logit))
    logits *= (1.0 / (total * N))[:, None].astype(F32)
    logits[rows, targets] -= F32(1.0 / N)
    return loss, logits


class GPT:
    """Loss and gradients of the whole model for one micro-batch of (B, T) token ids."""

    def __init__(self, arch: Arch, batch: int, seq_len: int | None = None):
        self.arch = arch
        self.B, self.T = batch, seq_len or arch.seq_len
        self.attention = Attention(arch, self.B, self.T)
        self.mlp = MLP(arch)

    def forward(self, params: dict[str, np.ndarray], idx: np.ndarray, rng: np.random.Generator | None = None):
        """The forward pass of one micro-batch: the logits (N, vocab) and what the backward needs.
        rng: dropout's generator (None: no dropout)."""
        a, B, T = self.arch, self.B, self.T
        N = B * T
        assert idx.shape == (B, T), (idx.shape, B, T)
        wte = params["wte.weight"]
        x = (wte[idx] + params["wpe.weight"][:T]).reshape(N, a.d_model)  # (N, C)
        drop_emb = dropout_mask(rng, a.dropout, x.shape)
        if drop_emb is not None:
            x *= drop_emb
        caches = []
        for i in range(a.n_layers):
            pre = f"blocks.{i}."
            h, ln1 = layernorm(x, params[pre + "ln1.weight"])
            att, att_cache = self.attention.forward(h, params[pre + "attn.qkv.weight"],
                                                    params[pre + "attn.proj.weight"], rng)
            drop_att = dropout_mask(rng, a.dropout, att.shape)
            if drop_att is not None:
                att *= drop_att
            x = x + att
            h, ln2 = layernorm(x, params[pre + "ln2.weight"])
            m, mlp_cache = self.mlp.forward(h, params[pre + "mlp.fc.weight"], params[pre + "mlp.proj.weight"])
            drop_mlp = dropout_mask(rng, a.dropout, m.shape)
            if drop_mlp is not None:
                m *= drop_mlp
            x += m  # x is this block's own array now: in place is safe
            caches.append((ln1, att_cache, drop_att, ln2, mlp_cache, drop_mlp))
        xf, lnf = layernorm(x, params["ln_f.weight"])
        logits = mm(xf, wte.T)  # (N, vocab): the tied head
        return logits, (xf, lnf, caches, drop_emb)

    def loss(self, params: dict[str, np.ndarray], idx: np.ndarray, targets: np.ndarray) -> float:
        """The mean loss of one micro-batch, forward only, without dropout (evaluation)."""
        logits, _ = self.forward(params, idx)
        return cross_entropy(logits, targets.reshape(-1))[0]

    def loss_and_grads(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray], idx: np.ndarray,
                       targets: np.ndarray, rng: np.random.Generator | None = None, scale: float = 1.0) -> float:
        """Forward and backward of one micro-batch; the gradients (times `scale`, e.g. 1 / grad_accum)
        are ADDED into `grads` (same names and shapes as params), so micro-batches accumulate.
        rng: dropout's generator (None: no dropout)."""
        a, B, T = self.arch, self.B, self.T
        N = B * T
        idx_flat = idx.reshape(N)
        logits, (xf, lnf, caches, drop_emb) = self.forward(params, idx, rng)
        loss, dlogits = cross_entropy(logits, targets.reshape(N))
        wte = params["wte.weight"]

        # backward
        if scale != 1.0:
            dlogits *= F32(scale)
        g = _Grads(grads)
        g.add("wte.weight", mm(dlogits.T, xf))  # head part of the tied weight
        dx = layernorm_backward(mm(dlogits, wte), lnf, g.buffer("ln_f.weight"))
        g.commit("ln_f.weight")
        for i in reversed(range(a.n_layers)):
            pre = f"blocks.{i}."
            ln1, att_cache, drop_att, ln2, mlp_cache, drop_mlp = caches[i]
            dm = dx * drop_mlp if drop_mlp is not None else dx
            dh = self.mlp.backward(dm, mlp_cache, params[pre + "mlp.fc.weight"], params[pre + "mlp.proj.weight"],
                                   g.buffer(pre + "mlp.fc.weight"), g.buffer(pre + "mlp.proj.weight"))
            g.commit(pre + "mlp.fc.weight", pre + "mlp.proj.weight")
            dx = dx + layernorm_backward(dh, ln2, g.buffer(pre + "ln2.weight"))
            g.commit(pre + "ln2.weight")
            da = dx * drop_att if drop_att is not None else dx
            dh = self.attention.backward(da, att_cache, params[pre + "attn.qkv.weight"],
                                         params[pre + "attn.proj.weight"], g.buffer(pre + "attn.qkv.weight"),
                                         g.buffer(pre + "attn.proj.weight"))
            g.commit(pre + "attn.qkv.weight", pre + "attn.proj.weight")
            dx += layernorm_backward(dh, ln1, g.buffer(pre + "ln1.weight"))
            g.commit(pre + "ln1.weight")
        if drop_emb is not None:
            dx *= drop_emb
        g.add("wpe.weight", np.pad(dx.reshape(B, T, a.d_model).sum(axis=0),
                                   ((0, params["wpe.weight"].shape[0] - T), (0, 0))))
        np.add.at(grads["wte.weight"], idx_flat, dx)  # the embedding lookup's scatter-add
        return loss


class _Grads:
    """Writes a parameter's gradient straight into its buffer when it is the first contribution of
    the step (grads zeroed, `fresh`), or through a scratch array added in otherwise (accumulation)."""

    def __init__(self, grads: dict[str, np.ndarray]):
        self.grads = grads
        self.scratch: dict[str, np.ndarray] = {}

    def buffer(self, name: str) -> np.ndarray:
        out = np.empty_like(self.grads[name])
        self.scratch[name] = out
        return out

    def commit(self, *names: str) -> None:
        for name in names:
            self.grads[name] += self.scratch.pop(name)

    def add(self, name: str, value: np.ndarray) -> None:
        self.grads[name] += value
