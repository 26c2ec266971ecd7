"""What a configuration computes, where both the catalogue (constraints at enqueue) and the trainers
need to know: its Linear layers' shapes, the int4 kernel's limits, which precisions are still
simulated, and what no variable offers. Imports nothing from the project.
"""

from __future__ import annotations

# What no variable offers, and why: `bench.py machine` and docs/backends.md say so.
NOT_OFFERED = {
    "ipex": "Intel Extension for PyTorch is not offered: its last release targets torch 2.8, and an IPEX built "
            "for another torch refuses to load into this project's torch 2.13",
    "distributed=ccl": "oneCCL's torch bindings (oneccl_bind_pt, backend 'ccl') are not offered: they are not on "
                       "PyPI (Intel's own wheel index only), each release is built for one torch version and none "
                       "for torch 2.13; PyPI's oneccl runtime is the C library alone, no torch backend. Ranks "
                       "all-reduce over gloo",
}
# Precisions whose arithmetic is still a simulation, and what really runs: every place that names the
# mode (the report's tables, the plots) says so next to it; runs.gemm_format records each run's own words.
SIMULATED = {"q8": "simulated: fp32 GEMMs"}
# The int4 weight-only CPU kernel (torch.ops.aten._weight_int4pack_mm_for_cpu, precision=q4) packs
# each Linear's weight in groups of INT4_GROUP inputs and needs output widths divisible by
# INT4_N_MULTIPLE; a config whose widths it cannot take is refused at enqueue (int4_unsupported).
INT4_GROUP = 32  # the smallest group the kernel takes: the closest to per-weight scales
INT4_N_MULTIPLE = 16


def mlp_hidden(config: dict) -> int:
    """MLP hidden width. swiglu has three matrices instead of two, so its hidden width is 2/3 of
    mlp_ratio * d_model: the parameter count stays that of the two-matrix MLP (LLaMA's rule)."""
    if config["activation"] == "swiglu":
        return int(2 / 3 * config["mlp_ratio"] * config["d_model"])
    return int(config["mlp_ratio"] * config["d_model"])


def linear_shapes(config: dict) -> list[tuple[str, int, int]]:
    """(name, inputs, outputs) of each block's Linear layers: qkv, attention out, MLP in, MLP out."""
    d, hidden = config["d_model"], mlp_hidden(config)
    q_width = config["n_heads"] * config["head_dim"]
    kv_width = config["kv_heads"] * config["head_dim"]
    fc_out = 2 * hidden if config["activation"] == "swiglu" else hidden
    return [("attn.qkv", d, q_width + 2 * kv_width), ("attn.proj", q_width, d), ("mlp.fc", d, fc_out),
            ("mlp.proj", hidden, d)]


def int4_unsupported(config: dict) -> str | None:
    """Why precision=q4's int4 kernel cannot take this config's Linear shapes, or None."""
    for name, n_in, n_out in linear_shapes(config):
        if n_out % INT4_N_MULTIPLE or n_in % INT4_GROUP:
            return (f"precision=q4 needs Linear outputs divisible by {INT4_N_MULTIPLE} and inputs by {INT4_GROUP} "
                    f"(the int4 CPU kernel)")
    return None
