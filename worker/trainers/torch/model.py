"""A nanoGPT-like decoder in torch: the architecture variables of the catalogue.

Reads bottom-up: the attention mask, attention, MLP, block, and the whole model last.
No prints, no file access: the training (train.py) owns those. FLOPs and parameter counts
come from the config alone (worker/trainers/harness.py), so every framework counts alike;
count_params(), matmul_params() and flops_per_step() here count the module (tests/test_harness.py keeps
the two equal); the trainer reports the harness's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from worker.trainers.harness import attended_positions, mlp_hidden
from worker.trainers.torch.quant import QUANT_MODES, Int4Linear, Int8Linear, QuantLinear


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 4096  # a small BPE on ~1k rows of text does not need more
    seq_len: int = 128  # learned positions: the longest sequence the model can see
    n_layers: int = 2  # the catalogue's default: small enough for a 2-core machine
    d_model: int = 128  # residual width
    n_heads: int = 4  # query heads
    head_dim: int = 32  # n_heads * head_dim is the attention width; it may differ from d_model
    kv_heads: int = 4  # < n_heads: grouped-query (1: multi-query); K/V projections really shrink
    mlp_ratio: float = 4.0  # GPT-2's MLP hidden width / d_model
    dropout: float = 0.0  # off by default: benchmarks compare kernels, not regularisation
    activation: str = "gelu"  # gelu | relu | silu | swiglu
    attention: str = "full"  # full causal | local (block-diagonal windows) | sliding (last `window`)
    window: int = 64  # tokens a local block / sliding window spans (ignored for full)
    attn_backend: str = "sdpa"  # manual (matmul + softmax) | sdpa (torch picks) | sdpa_math
    precision: str = "fp32"  # q8/q4/bitnet/int8 change the blocks' Linears (quant.py); bf16/mixed are the trainer's

    def __post_init__(self):
        assert self.n_heads % self.kv_heads == 0, "kv_heads must divide n_heads"
        assert self.activation in ("gelu", "relu", "silu", "swiglu"), self.activation
        assert self.attention in ("full", "local", "sliding"), self.attention
        assert self.attn_backend in ("manual", "sdpa", "sdpa_math"), self.attn_backend

    @classmethod
    def from_config(cls, config: dict) -> ModelConfig:
        """The model's part of a resolved catalogue config."""
        return cls(**{f.name: config[f.name] for f in fields(cls)})

    @property
    def mlp_hidden(self) -> int:
        """MLP hidden width (harness.mlp_hidden: swiglu keeps the two-matrix MLP's parameter count)."""
        return mlp_hidden({"activation": self.activation, "mlp_ratio": self.mlp_ratio, "d_model": self.d_model})


def attention_mask(kind: str, seq_len: int, window: int) -> torch.Tensor:
    """(T, T) bool, True where query i may attend to key j. Never the future (j <= i); local: only
    inside i's block of `window` tokens; sliding: only the last `window` tokens, i itself included."""
    i = torch.arange(seq_len)[:, None]
    j = torch.arange(seq_len)[None, :]
    mask = j <= i
    if kind == "local":
        mask &= (i // window) == (j // window)
    elif kind == "sliding":
        mask &= (i - j) < window
    return mask


def make_linear(cfg: ModelConfig, n_in: int, n_out: int) -> nn.Linear:
    if cfg.precision in QUANT_MODES:
        return QuantLinear(n_in, n_out, bias=False, mode=cfg.precision)
    if cfg.precision == "q4":
        return Int4Linear(n_in, n_out, bias=False)
    if cfg.precision in ("int8", "bitnet"):
        return Int8Linear(n_in, n_out, bias=False, ternary=cfg.precision == "bitnet")
    return nn.Linear(n_in, n_out, bias=False)  # no biases: as in LLaMA/PaLM, fewer copies, same loss


def attend(q, k, v, mask, is_causal: bool, p: float, backend: str) -> torch.Tensor:
    """Scaled dot-product attention of q (N, H, L, D) over k, v (N, Hkv, S, D) -> (N, H, L, D).

    mask: bool, broadcastable to (N, H, L, S), True where allowed, or None; is_causal: the causal
    mask of L == S instead. Hkv < H: grouped-query, each K/V head serves H / Hkv query heads.
    backend manual: written out (the reference); sdpa: torch picks the kernel; sdpa_math: its math one.
    """
    gqa = k.size(1) != q.size(1)
    if backend == "manual":
        if gqa:  # each K/V head serves `rep` query heads
            rep = q.size(1) // k.size(1)
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))  # (N, H, L, S)
        if is_causal:
            mask = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril()
        if mask is not None:
            att = att.masked_fill(~mask, float("-inf"))
        att = F.dropout(att.softmax(dim=-1), p, training=p > 0)
        return att @ v
    if backend == "sdpa_math":
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal,
                                                  enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal,
                                          enable_gqa=gqa)


def sliding_block_mask(n_blocks: int, window: int, device=None) -> torch.Tensor:
    """(n_blocks, W, 2W) bool: query a of block b may see key c of [block b-1, block b] when
    a < c <= a + W (key position (b-1)W + c is at or before the query bW + a, and fewer than W
    before it). Block 0 has no predecessor: its first W keys are padding, masked out."""
    a = torch.arange(window, device=device)[:, None]
    c = torch.arange(2 * window, device=device)[None, :]
    mask = ((c > a) & (c <= a + window)).expand(n_blocks, window, 2 * window).clone()
    mask[0] &= c >= window
    return mask


def windowed_attention(q, k, v, kind: str, window: int, p: float, backend: str) -> torch.Tensor:
    """Local or sliding attention that computes only blocks near the diagonal.

    q: (B, T, H, D), k and v: (B, T, Hkv, D) -> (B, T, H, D). The sequence is cut into
    n = ceil(T / W) blocks of W = min(window, T) tokens, the last one zero-padded (padded keys sit
    after every real query, so a causal mask hides them; padded queries are dropped at the end).
      local:   each block attends to itself, causally: n attentions of W x W (T * W scores, not T^2).
      sliding: each block's queries attend to the keys of the previous block and its own (2W keys),
               masked to j <= i and i - j < W (sliding_block_mask): n attentions of W x 2W.
    Blocks go into the batch dimension, so each backend (manual, sdpa, sdpa_math) runs unchanged on
    them; the result equals dense attention under attention_mask(kind, T, window). Sliding blocks
    of W/2 against 3 such key blocks (1.5W keys, not 2W) measured faster at W 128/256 but slower at
    64 (README, measured table): not taken.
    """
    B, T, H, D = q.shape
    Hkv = k.size(2)
    W = min(window, T)
    n = -(-T // W)
    pad = n * W - T
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v))
    qb = q.reshape(B * n, W, H, D).transpose(1, 2)  # (B * n, H, W, D)
    if kind == "local":
        kb = k.reshape(B * n, W, Hkv, D).transpose(1, 2)
        vb = v.reshape(B * n, W, Hkv, D).transpose(1, 2)
        y = attend(qb, kb, vb, None, True, p, backend)
    else:
        def with_previous(t):  # (B, n * W, Hkv, D) -> (B * n, Hkv, 2W, D): block b-1 then block b
            t = t.view(B, n, W, Hkv, D)
            prev = F.pad(t, (0, 0, 0, 0, 0, 0, 1, 0))[:, :n]
            return torch.cat([prev, t], dim=2).view(B * n, 2 * W, Hkv, D).transpose(1, 2)
        mask = sliding_block_mask(n, W, q.device)
        mask = mask[None].expand(B, n, W, 2 * W).reshape(B * n, 1, W, 2 * W)
        y = attend(qb, with_previous(k), with_previous(v), mask, False, p, backend)
    y = y.transpose(1, 2).reshape(B, n * W, H, D)
    return y[:, :T] if pad else y


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.q_width = cfg.n_heads * cfg.head_dim
        self.kv_width = cfg.kv_heads * cfg.head_dim
        # one fused projection for Q, K and V: one GEMM instead of three
        self.qkv = make_linear(cfg, cfg.d_model, self.q_width + 2 * self.kv_width)
        self.proj = make_linear(cfg, self.q_width, cfg.d_model)
        self.proj.residual = True  # init scaled by depth (GPT-2)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        cfg = self.cfg
        q, k, v = self.qkv(x).split([self.q_width, self.kv_width, self.kv_width], dim=2)
        q = q.view(B, T, cfg.n_heads, cfg.head_dim)
        k = k.view(B, T, cfg.kv_heads, cfg.head_dim)
        v = v.view(B, T, cfg.kv_heads, cfg.head_dim)
        p = cfg.dropout if self.training else 0.0
        if cfg.attention == "full":
            y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, True, p, cfg.attn_backend)
            y = y.transpose(1, 2)  # (B, T, n_heads, head_dim)
        else:
            y = windowed_attention(q, k, v, cfg.attention, cfg.window, p, cfg.attn_backend)
        y = y.reshape(B, T, self.q_width)  # (B, T, n_heads * head_dim)
        return self.resid_dropout(self.proj(y))  # (B, T, d_model)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.activation = cfg.activation
        hidden = cfg.mlp_hidden
        # swiglu: gate and up projections fused into one GEMM, split after
        self.fc = make_linear(cfg, cfg.d_model, 2 * hidden if cfg.activation == "swiglu" else hidden)
        self.proj = make_linear(cfg, hidden, cfg.d_model)
        self.proj.residual = True
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)  # (B, T, hidden) or (B, T, 2 * hidden) for swiglu
        if self.activation == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up  # (B, T, hidden)
        elif self.activation == "gelu":
            h = F.gelu(h)  # exact (erf) gelu: on a CPU twice as fast as GPT-2's tanh form, fwd + bwd
        elif self.activation == "relu":
            h = F.relu(h)
        else:
            h = F.silu(h)
        return self.dropout(self.proj(h))  # (B, T, d_model)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=False)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=False)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class CrossEntropy(torch.autograd.Function):
    """Mean next-token cross-entropy, equal to F.cross_entropy, with fewer passes over the logits.

    F.cross_entropy's backward zero-fills an N x vocab tensor, scatters into it, then runs
    log_softmax's backward over two such tensors. Here the backward writes softmax - onehot in one
    pass plus an in-place scatter and scale. At vocab 8192 the logits are the largest activation;
    this measured 15-25% faster than F.cross_entropy (forward + backward) on 2048 x 8192 logits.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(logits, dim=-1)  # (N, vocab)
        ctx.save_for_backward(logp, targets)
        return -logp.gather(1, targets[:, None]).mean()

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        logp, targets = ctx.saved_tensors
        grad = logp.exp()  # (N, vocab): softmax
        grad.scatter_add_(1, targets[:, None], grad.new_full((len(targets), 1), -1.0))  # - onehot
        grad.mul_(grad_loss / len(targets))
        return grad, None


class HeadCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of the tied head's logits x @ w.T (fp32) against targets, written with its
    gradient and cut into row chunks: no (N, vocab) tensor ever exists.

    Each chunk of CHUNK rows computes its logits into one buffer reused by every chunk, the
    softmax by hand in place (max, exp(z - max), sum, scale; loss = log(sum) + max - z_target, as
    jax/model.py's head_cross_entropy), then (softmax - onehot) / N and both products: its rows of dx
    and its share of dw (the first chunk writes dw, the others accumulate). The backward pass
    returns them as they are under a unit upstream gradient (one micro-batch), else scaled. At vocab
    8192 the logits, their log-softmax and their gradient were each a 64 MB tensor that glibc maps
    fresh on every step (page faults on first touch, larger than its 32 MB mmap ceiling); a chunk of
    512 rows is 16 MB, allocated once per step. fp32 only, without autocast: bf16 would round dw
    once per chunk, not once.
    """

    # rows: measured best of 256 / 512 / 1024 on the d256 config at 1 and 2 threads (README, "The
    # torch trainer's speed"); 256 was the 1-thread choice under log_softmax + exp_
    CHUNK = 512

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        n, chunk = x.size(0), HeadCrossEntropy.CHUNK
        dx = torch.empty_like(x) if ctx.needs_input_grad[0] else None
        dw = torch.empty_like(w) if ctx.needs_input_grad[1] else None
        logits = x.new_empty(min(chunk, n), w.size(0))  # (chunk, vocab), reused by every chunk
        total = x.new_zeros(())
        for s in range(0, n, chunk):
            xc, tc = x[s:s + chunk], targets[s:s + chunk, None]
            g = torch.mm(xc, w.t(), out=logits[:len(tc)])  # (rows, vocab)
            top = g.amax(1, keepdim=True)  # (rows, 1)
            z_target = g.gather(1, tc)
            sums = g.sub_(top).exp_().sum(1, keepdim=True)  # g: exp(z - max)
            total += (sums.log() - z_target.sub_(top)).sum()  # -log softmax of the targets
            g.mul_(sums.reciprocal_().mul_(1.0 / n)).scatter_add_(1, tc, g.new_full(tc.shape, -1.0 / n))
            if dx is not None:
                torch.mm(g, w, out=dx[s:s + len(tc)])
            if dw is not None:
                torch.mm(g.t(), xc, out=dw) if s == 0 else dw.addmm_(g.t(), xc)
        ctx.save_for_backward(dx, dw)
        return total / n

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        dx, dw = ctx.saved_tensors
        if grad_loss.item() == 1.0:  # the saved products are the gradients: no copies
            return dx, dw, None
        return (None if dx is None else dx * grad_loss), (None if dw is None else dw * grad_loss), None


def head_loss_path(weight_dtype: torch.dtype, input_dtype: torch.dtype, autocast: bool, fused: bool) -> str:
    """How GPT.forward(return_logits=not fused) computes a training loss: 'chunked' (HeadCrossEntropy)
    or 'logits: <why>' (the (N, vocab) logits and CrossEntropy). The trainer reads it back."""
    if not fused:
        return "logits: the caller asked for them (torch.compile: inductor fuses the loss itself)"
    if weight_dtype != torch.float32 or input_dtype != torch.float32 or autocast:
        return "logits: chunked is fp32 only (bf16 would round the head's gradient once per chunk)"
    return f"chunked: HeadCrossEntropy, {HeadCrossEntropy.CHUNK}-row chunks, no (N, vocab) tensor"


class GPT(nn.Module):
    """Token + learned position embeddings, n_layers blocks, a head tied to the token embedding.

    The embeddings and the head stay full precision under q8/q4/bitnet/int8, as in BitNet: only the
    blocks' Linear layers are quantized.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=False)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.wte.weight  # tied: fewer parameters, and better on small data
        self.apply(self._init)

    def _init(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if getattr(module, "residual", False) else 0.02
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, return_logits: bool = True):
        """logits (B, T, vocab); with targets (logits, mean loss). return_logits=False: (None, loss),
        by HeadCrossEntropy where it applies (fp32 weights, no autocast, grad on), never holding the
        (B, T, vocab) logits."""
        B, T = idx.shape
        assert T <= self.cfg.seq_len, f"sequence of {T} tokens > seq_len {self.cfg.seq_len}"
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, d_model)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        path = head_loss_path(self.head.weight.dtype, x.dtype, torch.is_autocast_enabled("cpu"), not return_logits)
        if targets is not None and torch.is_grad_enabled() and path.startswith("chunked"):
            return None, HeadCrossEntropy.apply(x.reshape(B * T, -1), self.head.weight, targets.reshape(B * T))
        logits = self.head(x)  # (B, T, vocab_size)
        if targets is None:
            return logits
        # the loss in fp32 also under bf16: a bf16 log-softmax over thousands of classes is too coarse
        loss = CrossEntropy.apply(logits.float().view(B * T, -1), targets.reshape(B * T))
        return logits, loss


class LoRALinear(nn.Module):
    """A frozen Linear plus a trainable rank-r update: y = x W^T + (x A^T) B^T (LoRA, Hu et al. 2021).

    A (r x in) starts random (Kaiming-uniform, as in the paper), B (out x r) at zero, so the model
    starts exactly as the base. W has requires_grad False: autograd computes no weight gradient
    for it (the dW GEMM is skipped), only the input gradient the layers below need.
    """

    def __init__(self, base: nn.Module, rank: int):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))

    merged = True  # MergedLoRA where it applies (benchmarks/workloads.py turns it off to compare)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.merged and type(self.base) is nn.Linear and self.base.bias is None \
                and not torch.is_autocast_enabled("cpu") and x.dtype == self.base.weight.dtype == self.lora_a.dtype:
            return MergedLoRA.apply(x, self.base.weight, self.lora_a, self.lora_b)
        return self.base(x) + F.linear(F.linear(x, self.lora_a), self.lora_b)  # quantized bases, autocast

    def merged_weight(self) -> torch.Tensor:
        return self.base.weight + self.lora_b @ self.lora_a


class MergedLoRA(torch.autograd.Function):
    """x (W + B A)^T with the gradients LoRA needs, and no more: equal to x W^T + (x A^T) B^T.

    The two-path form reads and writes the (tokens, out) output twice more in the forward pass and
    the (tokens, in) input gradient twice more in the backward pass (the adapter's own product and
    the sums): memory-bound passes that ate most of what the frozen dW GEMMs saved. Here the
    forward pass is one GEMM with the merged weight (B A costs out x r x in once a step, not per
    token) plus x A^T (tokens x r, kept for dB); the backward pass is the input gradient's GEMM
    against the merged weight, then dB = g^T (x A^T) and dA = (g B)^T x. The frozen W gets no
    gradient; x's gradient is g (W + B A), as in the two-path form.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        merged = torch.addmm(w, b, a)  # W + B A, (out, in)
        xa = F.linear(x, a)  # (..., r)
        ctx.save_for_backward(x, xa, merged, a, b)
        return F.linear(x, merged)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, xa, merged, a, b = ctx.saved_tensors
        g2, x2, xa2 = g.reshape(-1, g.size(-1)), x.reshape(-1, x.size(-1)), xa.reshape(-1, xa.size(-1))
        dx = g @ merged if ctx.needs_input_grad[0] else None
        db = g2.t() @ xa2 if ctx.needs_input_grad[3] else None  # (out, r)
        da = (g2 @ b).t() @ x2 if ctx.needs_input_grad[2] else None  # (r, in)
        return dx, None, da, db


def add_lora(model: GPT, rank: int) -> GPT:
    """Freeze every weight of `model`, then put rank-`rank` adapters on the attention (qkv, proj)
    and MLP (fc, proj) projections of every block: the adapters are all the optimizer sees."""
    model.requires_grad_(False)
    for block in model.blocks:
        block.attn.qkv = LoRALinear(block.attn.qkv, rank)
        block.attn.proj = LoRALinear(block.attn.proj, rank)
        block.mlp.fc = LoRALinear(block.mlp.fc, rank)
        block.mlp.proj = LoRALinear(block.mlp.proj, rank)
    return model


def plain_state_dict(model: GPT) -> dict:
    """The state_dict of the plain GPT: LoRA adapters merged into their base weights, so a saved
    LoRA model loads into GPT like any other (and can be the start of a later finetune)."""
    out = {}
    for name, t in model.state_dict().items():
        if ".lora_" in name:
            continue
        out[name.replace(".base.weight", ".weight")] = t
    for name, m in model.named_modules():
        if isinstance(m, LoRALinear):
            out[f"{name}.weight"] = m.merged_weight().detach()
    return out


def count_params(model: nn.Module) -> int:
    """All parameters, the tied head counted once (LoRA adapters included)."""
    return sum(p.numel() for p in model.parameters())


def trainable_params(model: nn.Module) -> int:
    """The parameters the optimizer updates: all of them, or only the adapters under LoRA."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def matmul_params(model: GPT) -> int:
    """Weights that take part in a matmul: every Linear of the blocks, plus the head (vocab x d).
    Embedding lookups, positions and LayerNorm gains are not GEMMs."""
    n = sum(m.weight.numel() for m in model.blocks.modules() if isinstance(m, nn.Linear))
    return n + model.head.weight.numel()


def flops_per_step(model: GPT, batch_size: int, grad_accum: int, merged: bool = True) -> int:
    """Training FLOPs of one optimizer step (forward + backward), counted like PaLM / nanoGPT:

        tokens        = batch_size * grad_accum * seq_len
        flops_per_step = 6 * N_matmul * tokens
                       + 12 * n_layers * n_heads * head_dim * A * batch_size * grad_accum

    N_matmul = matmul_params(): 2 FLOPs per weight per token forward, 4 backward. Attention scores
    (QK^T) and the weighted sum (AV) are each 2 * head_dim FLOPs per query head per attended
    (query, key) pair forward, x3 with backward: 12 * n_heads * head_dim per pair. A =
    attended_positions(): only pairs the mask allows count (T(T+1)/2 for full causal, fewer for
    local/sliding windows), so this counts useful work, not the masked half a kernel may compute.
    GQA shrinks the K/V projections (fewer matmul weights) but not the score/sum work: that follows
    the query heads. Elementwise work (softmax, norms, activations, optimizer) is not counted.

    With LoRA adapters (add_lora) only what runs is counted (harness.flops_per_step has the
    derivation): merged adapters (MergedLoRA: a plain Linear base, `merged` on; without autocast)
        (4 * N_matmul - 2 * qkv_0 + 4 * N_lora) * tokens + 2 * r * (sum of in * out) * grad_accum + attention
    and adapters run as a second path (quantized bases, merged off, autocast: merged=False)
        (4 * N_matmul - 2 * qkv_0 + 6 * N_lora - 2 * r * d_model) * tokens + attention
    N_lora = r * (in + out) weights over all adapted layers.
    """
    cfg = model.cfg
    tokens = batch_size * grad_accum * cfg.seq_len
    pairs = attended_positions(cfg.attention, cfg.seq_len, cfg.window)
    attention = 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * pairs * batch_size * grad_accum
    adapters = [m for m in model.modules() if isinstance(m, LoRALinear)]
    if not adapters:
        return 6 * matmul_params(model) * tokens + attention
    n_lora = sum(m.lora_a.numel() + m.lora_b.numel() for m in adapters)
    rank = adapters[0].lora_a.size(0)
    qkv_0 = model.blocks[0].attn.qkv.base.weight.numel()
    if merged and all(m.merged and type(m.base) is nn.Linear for m in adapters):
        merges = sum(2 * rank * m.base.weight.numel() for m in adapters) * grad_accum
        return (4 * matmul_params(model) - 2 * qkv_0 + 4 * n_lora) * tokens + merges + attention
    per_token = 4 * matmul_params(model) - 2 * qkv_0 + 6 * n_lora - 2 * rank * cfg.d_model
    return per_token * tokens + attention
