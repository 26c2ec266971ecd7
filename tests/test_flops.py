"""harness.flops_per_step held against PyTorch's own counter (torch.utils.flop_counter.FlopCounterMode)
on a real forward + backward of the torch model, grad_accum micro-batches, with the written-out
attention (attn_backend=manual: every product is a matmul the counter sees).

flops_per_step counts useful work: only the (query, key) pairs the mask allows. The written-out
attention also multiplies the pairs it masks (the causal upper triangle, the padding of the last
window block, the masked half of a sliding block's 2W keys), so the counter sees exactly those on
top: 12 * n_layers * n_heads * head_dim * (computed - attended pairs) per sequence. Nothing else may
differ."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from worker.trainers import harness
from worker.trainers.torch.model import GPT, LoRALinear, ModelConfig, add_lora

BASE = dict(vocab_size=64, seq_len=32, n_layers=2, d_model=32, n_heads=4, head_dim=8, kv_heads=4, window=8,
            attn_backend="manual")
CONFIGS = [
    {},
    {"kv_heads": 2},  # GQA
    {"kv_heads": 1, "activation": "swiglu"},  # MQA, three-matrix MLP
    {"head_dim": 16, "mlp_ratio": 2.5, "activation": "relu"},
    {"attention": "local"},
    {"attention": "local", "window": 12},  # a last block shorter than the window: padded
    {"attention": "sliding"},
    {"task": "finetune_lora", "lora_rank": 4},  # merged adapters
    {"task": "finetune_lora", "lora_rank": 8, "activation": "swiglu", "kv_heads": 2},
    {"task": "finetune_lora", "lora_rank": 4, "precision": "mixed"},  # autocast: two-path adapters
]
TRAINER = ("task", "lora_rank", "precision")  # the trainer's, not the model's


def computed_pairs(kind: str, seq_len: int, window: int) -> int:
    """(query, key) products the written-out attention computes per head and sequence (model.py)."""
    if kind == "full":
        return seq_len * seq_len
    w = min(window, seq_len)
    blocks = -(-seq_len // w)
    return blocks * w * (w if kind == "local" else 2 * w)


def counted(overrides: dict, batch_size: int, grad_accum: int) -> tuple[int, int, int]:
    """(FlopCounterMode's count, harness.flops_per_step, the masked pairs' FLOPs) of one optimizer step."""
    trainer = {"task": "pretrain", "lora_rank": 8, "precision": "fp32"} | {
        k: v for k, v in overrides.items() if k in TRAINER}
    cfg = ModelConfig(**(BASE | {k: v for k, v in overrides.items() if k not in TRAINER}))
    torch.manual_seed(0)
    model = GPT(cfg)
    if trainer["task"] == "finetune_lora":
        add_lora(model, trainer["lora_rank"])
    g = torch.Generator().manual_seed(1)
    with FlopCounterMode(display=False) as counter:
        for _ in range(grad_accum):
            x = torch.randint(0, cfg.vocab_size, (batch_size, cfg.seq_len), generator=g)
            y = torch.randint(0, cfg.vocab_size, (batch_size, cfg.seq_len), generator=g)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=trainer["precision"] == "mixed"):
                _, loss = model(x, y, return_logits=False)
            (loss / grad_accum).backward()
    config = asdict(cfg) | trainer | {"batch_size": batch_size, "grad_accum": grad_accum}
    masked = (12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * batch_size * grad_accum
              * (computed_pairs(cfg.attention, cfg.seq_len, cfg.window)
                 - harness.attended_positions(cfg.attention, cfg.seq_len, cfg.window)))
    return counter.get_total_flops(), harness.flops_per_step(config), masked


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "base")
@pytest.mark.parametrize("batch_size, grad_accum", [(3, 1), (2, 3)])
def test_flops_per_step_is_what_pytorchs_counter_sees_less_the_masked_pairs(overrides, batch_size, grad_accum):
    seen, analytic, masked = counted(overrides, batch_size, grad_accum)
    assert seen == analytic + masked


def test_the_old_six_flops_per_merged_adapter_weight_would_overcount():
    seen, analytic, masked = counted({"task": "finetune_lora", "lora_rank": 8}, 3, 1)
    config = asdict(ModelConfig(**BASE)) | {"task": "finetune_lora", "lora_rank": 8, "precision": "mixed",
                                              "batch_size": 3, "grad_accum": 1}
    two_path_count = harness.flops_per_step(config)  # 6 per adapter weight: right only for two paths
    assert two_path_count > analytic and seen == analytic + masked


def test_merged_lora_runs_where_the_harness_counts_it_merged():
    model = add_lora(GPT(ModelConfig(**BASE)), 4)
    adapters = [m for m in model.modules() if isinstance(m, LoRALinear)]
    assert adapters and all(m.merged and type(m.base) is torch.nn.Linear for m in adapters)
    assert "fp32" in harness.MERGED_LORA_PRECISIONS and "mixed" not in harness.MERGED_LORA_PRECISIONS


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "base")
def test_the_operations_of_a_step_sum_to_its_flops_and_their_shapes_to_their_flops(overrides):
    from common.compute import operations

    config = asdict(ModelConfig(**(BASE | {k: v for k, v in overrides.items() if k not in TRAINER}))) | {
        "task": "pretrain", "lora_rank": 8, "precision": "fp32", "optimizer": "adamw", "batch_size": 3,
        "grad_accum": 2} | {k: v for k, v in overrides.items() if k in TRAINER}
    ops = operations(config)
    assert sum(op.calls * op.flops for op in ops if op.kind != "memory") == harness.flops_per_step(config)
    assert all(op.flops == 2 * op.m * op.n * op.k * op.batch for op in ops if op.kind == "gemm")
    assert all(op.elements > 0 and op.calls > 0 for op in ops)
