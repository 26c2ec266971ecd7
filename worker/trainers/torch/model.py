"""A nanoGPT-like decoder in torch: the architecture variables of the catalogue.

Reads bottom-up: the attention mask, attention, MLP, block, and the whole model last.
No prints, no file access: the training child (child.py) owns those. FLOPs and parameter counts
come from the config alone (worker/trainers/harness.py), so every framework counts alike;
count_params() and matmul_params() here count the module, and the tests keep the two equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from worker.trainers.harness import mlp_hidden
from worker.trainers.torch.quant import QUANT_MODES, QuantLinear


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
    precision: str = "fp32"  # only q8/q4/bitnet change the modules; bf16/mixed are the trainer's

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
    return nn.Linear(n_in, n_out, bias=False)  # no biases: as in LLaMA/PaLM, fewer copies, same loss


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
        if cfg.attention != "full" or cfg.attn_backend == "manual":
            self.register_buffer("mask", attention_mask(cfg.attention, cfg.seq_len, cfg.window), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        cfg = self.cfg
        q, k, v = self.qkv(x).split([self.q_width, self.kv_width, self.kv_width], dim=2)
        q = q.view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2)  # (B, n_heads, T, head_dim)
        k = k.view(B, T, cfg.kv_heads, cfg.head_dim).transpose(1, 2)  # (B, kv_heads, T, head_dim)
        v = v.view(B, T, cfg.kv_heads, cfg.head_dim).transpose(1, 2)  # (B, kv_heads, T, head_dim)
        p = cfg.dropout if self.training else 0.0
        if cfg.attn_backend == "manual":
            y = self._manual(q, k, v, p)
        else:
            is_causal = cfg.attention == "full"
            mask = None if is_causal else self.mask[:T, :T]
            gqa = cfg.kv_heads != cfg.n_heads
            if cfg.attn_backend == "sdpa_math":
                with sdpa_kernel(SDPBackend.MATH):
                    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                       is_causal=is_causal, enable_gqa=gqa)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                   is_causal=is_causal, enable_gqa=gqa)
        y = y.transpose(1, 2).reshape(B, T, self.q_width)  # (B, T, n_heads * head_dim)
        return self.resid_dropout(self.proj(y))  # (B, T, d_model)

    def _manual(self, q, k, v, p: float) -> torch.Tensor:
        """Attention written out: the reference the fused kernels are checked against."""
        T = q.size(2)
        rep = self.cfg.n_heads // self.cfg.kv_heads
        if rep > 1:  # each K/V head serves `rep` query heads
            k = k.repeat_interleave(rep, dim=1)  # (B, n_heads, T, head_dim)
            v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))  # (B, n_heads, T, T)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(dim=-1)
        att = F.dropout(att, p, training=p > 0)
        return att @ v  # (B, n_heads, T, head_dim)


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


class GPT(nn.Module):
    """Token + learned position embeddings, n_layers blocks, a head tied to the token embedding.

    The embeddings and the head stay full precision under q8/q4/bitnet, as in BitNet: only the
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

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        assert T <= self.cfg.seq_len, f"sequence of {T} tokens > seq_len {self.cfg.seq_len}"
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, d_model)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))  # (B, T, vocab_size)
        if targets is None:
            return logits
        # the loss in fp32 also under bf16: a bf16 log-softmax over thousands of classes is too coarse
        loss = CrossEntropy.apply(logits.float().view(B * T, -1), targets.reshape(B * T))
        return logits, loss


def count_params(model: nn.Module) -> int:
    """All trainable parameters, the tied head counted once."""
    return sum(p.numel() for p in model.parameters())


def matmul_params(model: GPT) -> int:
    """Weights that take part in a matmul: every Linear of the blocks, plus the head (vocab x d).
    Embedding lookups, positions and LayerNorm gains are not GEMMs."""
    n = sum(m.weight.numel() for m in model.blocks.modules() if isinstance(m, nn.Linear))
    return n + model.head.weight.numel()
