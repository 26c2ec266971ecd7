"""The decoder of worker/trainers/torch/model.py in JAX: the loss as a pure function of the parameters, and the
training step (loss, gradient, optax update) that compile=xla hands to jax.jit whole.

Reads bottom-up: LayerNorm, attention, MLP, block, the loss, the optimizer and the step last.
Parameters are the dict of worker/trainers/params.py (torch's names and (out, in) layouts, the head
tied to `wte.weight`), as jax arrays. Attention follows worker/trainers/masks.py's block layout, so
local and sliding attention compute only the pairs their window can reach.

Precision: fp32 (everything fp32); bf16 (parameters, activations and optimizer state in bf16, as
torch's model.to(bfloat16)); mixed (fp32 parameters and optimizer, the forward's matmuls in bf16 as
torch's CPU autocast, LayerNorm, softmax and the loss in fp32).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from worker.trainers.masks import BlockLayout, block_layout
from worker.trainers.params import LN_EPS, Arch, is_gain

ADAMW_BETAS = (0.9, 0.95)  # the torch trainer's AdamW
ADAMW_EPS = 1e-8
ADAMW_WEIGHT_DECAY = 0.1
SGD_MOMENTUM = 0.9
PRECISIONS = ("fp32", "bf16", "mixed")


def compute_dtype(precision: str):
    return jnp.float32 if precision == "fp32" else jnp.bfloat16


def param_dtype(precision: str):
    return jnp.bfloat16 if precision == "bf16" else jnp.float32


# -- parts -------------------------------------------------------------------------------------


def layernorm(x, gain):
    """LayerNorm without bias, computed in fp32 whatever x's dtype (as torch's autocast does)."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    xc = x32 - mean
    var = (xc * xc).mean(-1, keepdims=True)
    return (xc * jax.lax.rsqrt(var + LN_EPS) * gain.astype(jnp.float32)).astype(x.dtype)


def linear(x, w, dtype):
    """(N, in) @ (out, in).T: torch's weight layout; w is cast to the compute dtype (a no-op in fp32).
    Activations stay 2-D (N = B * T tokens): the same product written as a 3-D einsum measured 2.3x
    slower through XLA CPU's dot emitter (90 vs 39 ms for the d256 MLP, forward + backward)."""
    return x.astype(dtype) @ w.astype(dtype).T


@jax.custom_vjp
def gelu(x):
    """Exact (erf) GELU, as the torch model. Its derivative Phi(x) + x phi(x) is written out: the one
    jax.grad derives through jax.nn.gelu measured 15 ms slower per d256 MLP (forward + backward)."""
    return jax.nn.gelu(x, approximate=False)


def _gelu_fwd(x):
    return gelu(x), x


def _gelu_bwd(x, g):
    x32 = x.astype(jnp.float32)
    cdf = 0.5 * (1.0 + jax.lax.erf(x32 * (1.0 / math.sqrt(2.0))))
    pdf = jnp.exp(-0.5 * x32 * x32) * (1.0 / math.sqrt(2.0 * math.pi))
    return ((g.astype(jnp.float32) * (cdf + x32 * pdf)).astype(x.dtype),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


@jax.custom_vjp
def head_cross_entropy(x, w, targets):
    """Mean cross-entropy (fp32) of the tied head's logits x @ w.T against targets, N = x.shape[0].

    Written with its gradient: the forward pass computes softmax - onehot once and both of its
    products (dx, dw); the backward pass only scales them. As torch's CrossEntropy in worker/trainers/torch/model.py,
    this saves passes over the (N, vocab) logits, the largest activation (10% of the head's time)."""
    return _head_ce(x, w, targets)[0]


def _head_ce(x, w, targets):
    logits = (x @ w.T).astype(jnp.float32)  # (N, vocab)
    top = jax.lax.stop_gradient(logits.max(-1, keepdims=True))
    e = jnp.exp(logits - top)
    total = e.sum(-1, keepdims=True)
    n = logits.shape[0]
    target_logit = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
    loss = jnp.mean(jnp.log(total[:, 0]) + top[:, 0] - target_logit)
    onehot = jnp.arange(logits.shape[1], dtype=targets.dtype)[None, :] == targets[:, None]
    dlogits = (e * (1.0 / (total * n)) - jnp.where(onehot, 1.0 / n, 0.0)).astype(x.dtype)
    return loss, (dlogits @ w, dlogits.T @ x)


def _head_ce_fwd(x, w, targets):
    loss, grads = _head_ce(x, w, targets)
    return loss, grads


def _head_ce_bwd(grads, g):
    dx, dw = grads
    return (dx * g.astype(dx.dtype), dw * g.astype(dw.dtype), None)


head_cross_entropy.defvjp(_head_ce_fwd, _head_ce_bwd)


def dropout(x, p: float, key):
    if key is None or p == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - p, x.shape)
    return jnp.where(keep, x / (1.0 - p), 0).astype(x.dtype)


def attention(x, w_qkv, w_proj, arch: Arch, layout: BlockLayout, dtype, key, B: int, T: int):
    """(N, C) -> (N, C), N = B * T. Query head h uses K/V head h // R (torch's repeat_interleave).

    The scores are batched matmuls over 4-D arrays (B, KV * n, R * W, K): the R query heads that share
    a K/V head are stacked into one matrix (GQA without copies of K and V), and the blocks of
    local/sliding attention sit beside the heads. The same contraction as one 6-D einsum with
    singleton axes measured 2x slower in XLA CPU (31 vs 16 ms forward + backward, d256 full).
    """
    KV, R, hd = arch.kv_heads, arch.n_heads // arch.kv_heads, arch.head_dim
    n, W, K, pad = layout.n_blocks, layout.block, layout.keys, layout.padded_len - T
    qkv = linear(x, w_qkv, dtype).reshape(B, T, -1)  # (B, T, qw + 2 kvw)
    q, k, v = jnp.split(qkv, [arch.q_width, arch.q_width + arch.kv_width], axis=-1)
    q = q * jnp.asarray(1.0 / math.sqrt(hd), q.dtype)  # the scale folded into Q: fewer elements than the scores
    if pad:
        q, k, v = (jnp.pad(t, ((0, 0), (0, pad), (0, 0))) for t in (q, k, v))
    q = q.reshape(B, n, W, KV, R, hd).transpose(0, 3, 1, 4, 2, 5).reshape(B, KV * n, R * W, hd)
    k = k.reshape(B, n, W, KV, hd).transpose(0, 3, 1, 2, 4)  # (B, KV, n, W, hd)
    v = v.reshape(B, n, W, KV, hd).transpose(0, 3, 1, 2, 4)
    if layout.key_blocks == 2:  # sliding: each block also sees the previous block's keys (block 0: zeros, masked)
        k = jnp.concatenate([jnp.pad(k, ((0, 0), (0, 0), (1, 0), (0, 0), (0, 0)))[:, :, :-1], k], axis=3)
        v = jnp.concatenate([jnp.pad(v, ((0, 0), (0, 0), (1, 0), (0, 0), (0, 0)))[:, :, :-1], v], axis=3)
    k = k.reshape(B, KV * n, K, hd)
    v = v.reshape(B, KV * n, K, hd)
    s = (q @ k.swapaxes(-1, -2)).astype(jnp.float32)  # (B, KV * n, R * W, K)
    s = jnp.where(_stacked_mask(layout, KV, R), s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1).astype(dtype)
    p = dropout(p, arch.dropout, key)
    y = p @ v  # (B, KV * n, R * W, hd)
    y = y.reshape(B, KV, n, R, W, hd).transpose(0, 2, 4, 1, 3, 5).reshape(B, n * W, arch.q_width)
    return linear(y[:, :T].reshape(B * T, arch.q_width), w_proj, dtype)


def _stacked_mask(layout: BlockLayout, kv_heads: int, rep: int) -> np.ndarray:
    """The layout's (n, W, K) mask laid out as the scores: (KV * n, R * W, K), a compile-time constant."""
    m = layout.mask()  # (n, W, K)
    m = np.broadcast_to(m[None, :, None], (kv_heads, layout.n_blocks, rep, layout.block, layout.keys))
    return m.reshape(kv_heads * layout.n_blocks, rep * layout.block, layout.keys)


def mlp(x, w_fc, w_proj, arch: Arch, dtype):
    h = linear(x, w_fc, dtype)
    if arch.activation == "swiglu":
        gate, up = jnp.split(h, 2, axis=-1)  # torch's chunk(2): the first half gates
        h = jax.nn.silu(gate) * up
    elif arch.activation == "gelu":
        h = gelu(h)
    elif arch.activation == "relu":
        h = jax.nn.relu(h)
    else:
        h = jax.nn.silu(h)
    return linear(h, w_proj, dtype)


def loss_fn(params: dict, idx, targets, arch: Arch, layout: BlockLayout, dtype, key=None):
    """Mean next-token cross-entropy (in fp32) of (B, T) ids; key: dropout's PRNG key or None."""
    B, T = idx.shape
    keys = list(jax.random.split(key, 1 + 3 * arch.n_layers)) if key is not None and arch.dropout else None

    def next_key():
        return keys.pop() if keys else None

    wte = params["wte.weight"]
    x = (wte[idx] + params["wpe.weight"][:T]).astype(dtype).reshape(B * T, arch.d_model)  # (N, C)
    x = dropout(x, arch.dropout, next_key())
    for i in range(arch.n_layers):
        pre = f"blocks.{i}."
        h = layernorm(x, params[pre + "ln1.weight"])
        h = attention(h, params[pre + "attn.qkv.weight"], params[pre + "attn.proj.weight"], arch, layout, dtype,
                      next_key(), B, T)
        x = x + dropout(h, arch.dropout, next_key())
        h = layernorm(x, params[pre + "ln2.weight"])
        h = mlp(h, params[pre + "mlp.fc.weight"], params[pre + "mlp.proj.weight"], arch, dtype)
        x = x + dropout(h, arch.dropout, next_key())
    x = layernorm(x, params["ln_f.weight"])
    return head_cross_entropy(x, wte.astype(dtype), targets.reshape(B * T))  # the head tied to wte


# -- training ------------------------------------------------------------------------------------


def make_optimizer(name: str, lr: float, params: dict, scheduled: bool = False) -> optax.GradientTransformation:
    """The torch trainer's optimizers in optax: AdamW (decay on matrices, not on gains) or SGD momentum.
    optax.adamw's update -lr (m_hat / (sqrt(v_hat) + eps) + wd p) is torch's decoupled rule exactly.
    scheduled: the learning rate lives in the optimizer state (optax.inject_hyperparams), so a schedule
    sets it between steps without recompiling; a constant one stays a constant of the compiled step."""
    wrap = optax.inject_hyperparams if scheduled else (lambda make: make)
    if name == "sgd":
        return wrap(optax.sgd)(lr, momentum=SGD_MOMENTUM)
    if name == "adamw":
        decay = {k: not is_gain(k) and np.ndim(v) >= 2 for k, v in params.items()}
        return wrap(optax.adamw)(lr, b1=ADAMW_BETAS[0], b2=ADAMW_BETAS[1], eps=ADAMW_EPS,
                                 weight_decay=ADAMW_WEIGHT_DECAY, mask=decay)
    raise ValueError(f"optimizer {name!r}: the JAX trainer knows adamw and sgd")


def to_device(params: dict[str, np.ndarray], precision: str) -> dict:
    return {k: jnp.asarray(v, dtype=param_dtype(precision)) for k, v in params.items()}


class Trainer:
    """One optimizer step over grad_accum micro-batches: jit'ed whole (compile=xla) or op by op (eager)."""

    def __init__(self, arch: Arch, params: dict[str, np.ndarray], optimizer: str, lr: float, precision: str,
                 jit: bool, seq_len: int | None = None, scheduled: bool = False):
        assert precision in PRECISIONS, precision
        self.arch = arch
        self.layout = block_layout(arch.attention, seq_len or arch.seq_len, arch.window)
        self.dtype = compute_dtype(precision)
        self.params = to_device(params, precision)
        self._lr = lr
        self._eval = None  # the jit'ed evaluation loss, made at the first eval_loss()
        self.tx = make_optimizer(optimizer, lr, self.params, scheduled)
        self.opt_state = self.tx.init(self.params)
        self.key = jax.random.PRNGKey(0)
        # Under jit a scan keeps the compiled program one micro-batch long whatever grad_accum is; op
        # by op, a scan would be traced and compiled anew at every call (its body is a new closure
        # each step: 1.3 s a step at grad_accum=2), so eager accumulates in a Python loop.
        step = partial(_train_step, tx=self.tx, arch=arch, layout=self.layout, dtype=self.dtype, scan=jit)
        # donate the parameters and optimizer state: XLA updates them in place instead of copying
        self._step = jax.jit(step, donate_argnums=(0, 1)) if jit else step

    def step(self, xs: np.ndarray, ys: np.ndarray, seed: int = 0):
        """xs, ys: (grad_accum, B, T) token ids. Returns the mean loss as a jax scalar (not synced)."""
        key = jax.random.fold_in(self.key, seed) if self.arch.dropout else None
        self.params, self.opt_state, loss = self._step(self.params, self.opt_state, jnp.asarray(xs),
                                                       jnp.asarray(ys), key)
        return loss

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next steps (an optimizer made with scheduled=True)."""
        self.opt_state.hyperparams["learning_rate"] = jnp.asarray(lr, dtype=jnp.float32)
        self._lr = lr

    def lr(self) -> float:
        """The learning rate in force, read from the optimizer state where it lives there."""
        hyper = getattr(self.opt_state, "hyperparams", None)
        return float(hyper["learning_rate"]) if hyper is not None else self._lr

    def eval_loss(self, idx: np.ndarray, targets: np.ndarray) -> float:
        """Mean loss of (B, T) held-out windows: no dropout, no gradients, the parameters unchanged."""
        if self._eval is None:
            self._eval = jax.jit(partial(loss_fn, arch=self.arch, layout=self.layout, dtype=self.dtype))
        return float(self._eval(self.params, jnp.asarray(idx), jnp.asarray(targets)))

    def numpy_params(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(v, dtype=np.float32) for k, v in self.params.items()}


def _train_step(params, opt_state, xs, ys, key, *, tx, arch, layout, dtype, scan=True):
    grad_fn = jax.value_and_grad(loss_fn)
    accum = xs.shape[0]

    def micro(carry, batch):
        total, acc = carry
        x, y, i = batch
        k = None if key is None else jax.random.fold_in(key, i)
        loss, grads = grad_fn(params, x, y, arch, layout, dtype, k)
        return (total + loss, jax.tree.map(jnp.add, acc, grads)), None

    if accum == 1:
        loss, grads = grad_fn(params, xs[0], ys[0], arch, layout, dtype, key)
    else:
        carry = (jnp.float32(0), jax.tree.map(jnp.zeros_like, params))
        if scan:  # under jit: one micro-batch's program, looped by XLA
            (loss, grads), _ = jax.lax.scan(micro, carry, (xs, ys, jnp.arange(accum)))
        else:  # eager: the same sum, op by op (every op's kernel compiled once, at the first step)
            for i in range(accum):
                carry, _ = micro(carry, (xs[i], ys[i], i))
            loss, grads = carry
        loss = loss / accum
        grads = jax.tree.map(lambda g: g / accum, grads)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
