"""torch eager vs JAX (jit, eager) vs NumPy: training throughput of the same model, interleaved.

    venv/bin/python benchmarks/frameworks.py                      # d256 config, 5 rounds
    venv/bin/python benchmarks/frameworks.py --rounds 7 --steps 12 --set attention=sliding --set window=64
    venv/bin/python benchmarks/frameworks.py --profile            # what dominates each framework's step

Each (round, framework) is a fresh child process (`--child NAME`): no framework's thread pool or
allocator warms another's, and JAX never shares a process with torch's OpenMP. A child builds the
model from the shared init (worker/trainers/params.py), runs `--warmup` untimed steps (compilation,
allocator and caches settle), then times `--steps` steps one by one on the same batches for every
framework. Rounds rotate the order of the frameworks, so drift on a shared machine hits all alike.

Printed per framework: the median over all timed steps, the min, the spread of the per-round
medians (min..max, and max/min - 1 as the noise), tokens/s of the median, and the ratio to torch
eager's tokens/s computed per round (paired: the runs of one round are minutes apart at most) with
its median and range. The losses of the last round (first and last timed step) show the frameworks
trained the same numbers.

The default config is the trainers' speed target: d_model 256, 4 layers, 4 heads, seq 256, batch 8,
vocab 8192, fp32, AdamW; the goals are JAX (xla) >= 0.6x and NumPy >= 0.4x torch eager's tokens/s.
Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

D256 = dict(vocab_size=8192, seq_len=256, n_layers=4, d_model=256, n_heads=4, head_dim=64, kv_heads=4, mlp_ratio=4.0,
            activation="gelu", attention="full", window=64, dropout=0.0, attn_backend="sdpa", precision="fp32",
            batch_size=8, optimizer="adamw", seed=0)
FRAMEWORKS = ("torch", "jax", "numpy", "jax-eager")
DEFAULT_FRAMEWORKS = ("torch", "jax", "numpy")
from common.variables import LR_OF as LR  # noqa: E402 (the trainers' default learning rates)


def batches(config: dict, n: int):
    """n (inputs, targets) pairs of (batch, seq_len) int32 token ids, the same in every child."""
    import numpy as np

    rng = np.random.default_rng(config["seed"] + 1)
    T = config["seq_len"]
    tokens = rng.integers(0, config["vocab_size"], (n, config["batch_size"], T + 1)).astype(np.int32)
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


# -- the children: one step function per framework ---------------------------------------------


def torch_step(config: dict):
    import torch

    from worker.trainers.torch.model import GPT, ModelConfig
    from worker.trainers.torch.train import make_optimizer, make_step
    from worker.trainers.params import init_params, torch_state_dict

    model = GPT(ModelConfig.from_config(config))
    model.load_state_dict(torch_state_dict(init_params(config)))
    model.train()
    step = make_step(model, make_optimizer(model, config, LR[config["optimizer"]]), config["precision"])

    def run(x, y):
        return float(step([(torch.from_numpy(x).long(), torch.from_numpy(y).long())]))  # float(): synced

    return run


def jax_step(config: dict, jit: bool):
    from worker.trainers.jax.model import Trainer
    from worker.trainers.params import Arch, init_params

    trainer = Trainer(Arch.from_config(config), init_params(config), config["optimizer"], LR[config["optimizer"]],
                      config["precision"], jit)

    def run(x, y):
        return float(trainer.step(x[None], y[None]).block_until_ready())

    return run


def numpy_step(config: dict):
    from worker.trainers.numpy.step import Trainer
    from worker.trainers.params import Arch, init_params

    trainer = Trainer(Arch.from_config(config), init_params(config), config["optimizer"], LR[config["optimizer"]],
                      config["batch_size"], config["seed"])

    def run(x, y):
        return trainer.step(x[None], y[None])

    return run


def make_step_fn(name: str, config: dict):
    if name == "torch":
        return torch_step(config)
    if name in ("jax", "jax-eager"):
        return jax_step(config, jit=name == "jax")
    return numpy_step(config)


def child(name: str, config: dict, warmup: int, steps: int) -> dict:
    data = batches(config, warmup + steps)
    step = make_step_fn(name, config)
    losses, times_ms = [], []
    for i, (x, y) in enumerate(data):
        t = time.perf_counter_ns()
        loss = step(x, y)
        if i >= warmup:
            times_ms.append((time.perf_counter_ns() - t) / 1e6)
        losses.append(loss)
    return {"step_ms": times_ms, "loss_first": losses[0], "loss_last": losses[-1]}


# -- the parent: interleaved rounds ------------------------------------------------------------


def run_child(name: str, config: dict, warmup: int, steps: int) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--config", json.dumps(config), "--warmup", str(warmup),
           "--steps", str(steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{name} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(config: dict, names: list[str], rounds: int, warmup: int, steps: int) -> None:
    tokens = config["batch_size"] * config["seq_len"]
    per_round: dict[str, list[float]] = {n: [] for n in names}
    all_steps: dict[str, list[float]] = {n: [] for n in names}
    last: dict[str, dict] = {}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            res = run_child(name, config, warmup, steps)
            per_round[name].append(statistics.median(res["step_ms"]))
            all_steps[name] += res["step_ms"]
            last[name] = res
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {per_round[n][-1]:.0f} ms" for n in names), file=sys.stderr)

    shown = {k: config[k] for k in ("d_model", "n_layers", "n_heads", "seq_len", "batch_size", "vocab_size",
                                    "attention", "window", "precision", "optimizer")}
    print(f"\nconfig: {shown}; {rounds} rounds x {steps} timed steps (after {warmup} warmup), "
          f"load average before the last round {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    print(f"{'framework':10s} {'median ms':>10s} {'min ms':>8s} {'round medians ms':>20s} {'noise':>6s} "
          f"{'tokens/s':>9s} {'x torch (median, range)':>26s} {'loss first':>11s} {'loss last':>10s}")
    for name in names:
        med = statistics.median(all_steps[name])
        rm = per_round[name]
        noise = max(rm) / min(rm) - 1
        ratio = ""
        if "torch" in per_round and name != "torch":
            ratios = [t / m for t, m in zip(per_round["torch"], rm)]  # tokens/s ratio = time ratio inverted
            ratio = f"{statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f})"
        print(f"{name:10s} {med:10.1f} {min(all_steps[name]):8.1f} {min(rm):9.0f}..{max(rm):<9.0f} {noise:6.1%} "
              f"{tokens / (med / 1e3):9.0f} {ratio:>26s} {last[name]['loss_first']:11.5f} "
              f"{last[name]['loss_last']:10.5f}")


# -- profiles: what dominates each framework's step ---------------------------------------------


def profile_numpy(config: dict, steps: int) -> None:
    """Wall time per part of the hand-written step (the parts are wrapped with timers), then
    cProfile's top functions. GEMMs run inside the parts; their share is estimated from the
    standalone SGEMM rate of the same shapes."""
    import numpy as np

    from worker.trainers.numpy import model as npm
    from worker.trainers.numpy import optim as npo

    parts: dict[str, float] = {}

    def timed(owner, attr, label):
        fn = getattr(owner, attr)

        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                parts[label] = parts.get(label, 0.0) + time.perf_counter() - t
        setattr(owner, attr, wrapper)

    timed(npm.Attention, "forward", "attention fwd (qkv+proj GEMMs, scores, softmax)")
    timed(npm.Attention, "backward", "attention bwd")
    timed(npm.MLP, "forward", "mlp fwd (GEMMs + activation)")
    timed(npm.MLP, "backward", "mlp bwd")
    timed(npm, "normal_cdf_pdf", "  of which GELU's CDF/PDF (fwd)")
    timed(npm, "layernorm", "layernorm fwd")
    timed(npm, "layernorm_backward", "layernorm bwd")
    timed(npm, "cross_entropy", "cross-entropy (softmax - onehot over logits)")
    timed(npo.AdamW, "step", "AdamW update")
    timed(npo.SGD, "step", "SGD update")
    step = numpy_step(config)
    data = batches(config, steps + 2)
    for x, y in data[:2]:
        step(x, y)
    parts.clear()
    t = time.perf_counter()
    for x, y in data[2:]:
        step(x, y)
    total = time.perf_counter() - t
    print(f"\n== numpy: {total / steps * 1e3:.0f} ms per step, parts (wall, per step):")
    for label, s in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {s / steps * 1e3:8.1f} ms {s / total:6.1%}  {label}")
    # the GEMMs run inside the parts: estimate their share from the SGEMM rate of the head's shape
    N, C, V = config["batch_size"] * config["seq_len"], config["d_model"], config["vocab_size"]
    a = np.random.rand(N, C).astype(np.float32)
    w = np.random.rand(V, C).astype(np.float32)
    a @ w.T
    t = time.perf_counter()
    for _ in range(3):
        a @ w.T
    rate = 2 * N * C * V / ((time.perf_counter() - t) / 3)
    flops = gemm_flops(config)
    print(f"  GEMMs: {flops / 1e9:.1f} GFLOP per step (attention scores computed over the whole block); at the "
          f"head's SGEMM rate ({rate / 1e9:.0f} GFLOP/s) {flops / rate * 1e3:.0f} ms = "
          f"{flops / rate / (total / steps):.0%} of the step")
    prof = cProfile.Profile()
    prof.enable()
    for x, y in data[2:]:
        step(x, y)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    print("  cProfile, top functions by own time (a GEMM written as `@` counts in its caller's own time):")
    print("\n".join("    " + line for line in out.getvalue().splitlines() if line.strip())[:4000])


def gemm_flops(config: dict) -> float:
    """Matmul FLOPs of one training step as the NumPy/JAX trainers compute them: 6 per weight per
    token for every projection and the head, and 12 * head_dim per (query, key) pair per head for
    the scores and the weighted sum, over every pair of a block (masked ones included)."""
    from worker.trainers.masks import block_layout
    from worker.trainers.params import Arch, is_gain, param_shapes

    arch = Arch.from_config(config)
    weights = sum(a * b for name, (a, b, *_) in
                  ((n, s + (1,)) for n, s in param_shapes(arch).items()) if not is_gain(name)
                  and name != "wpe.weight")
    tokens = config["batch_size"] * config["seq_len"]
    pairs = block_layout(arch.attention, config["seq_len"], arch.window).pairs() * config["batch_size"]
    return 6 * weights * tokens + 12 * arch.n_layers * arch.n_heads * arch.head_dim * pairs


def profile_jax(config: dict, steps: int) -> None:
    """Each part of the step jit-compiled alone (forward + backward), timed; their sum against the
    whole jit-compiled step; and XLA's own FLOP count of the whole step."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from worker.trainers.jax import model as jm
    from worker.trainers.masks import block_layout
    from worker.trainers.params import Arch, init_params

    arch = Arch.from_config(config)
    B, T, C = config["batch_size"], config["seq_len"], config["d_model"]
    layout = block_layout(arch.attention, T, arch.window)
    dtype = jm.compute_dtype(config["precision"])
    params = jm.to_device(init_params(config), config["precision"])
    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.standard_normal((B * T, C)), dtype)
    ids = jnp.asarray(rng.integers(0, arch.vocab_size, (B, T)).astype(np.int32))

    def timeit(fn, *args):
        jax.block_until_ready(fn(*args))
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    p0 = "blocks.0."
    parts = {
        "attention fwd+bwd (x n_layers)": (arch.n_layers, jax.jit(jax.grad(
            lambda h, a, b: jm.attention(h, a, b, arch, layout, dtype, None, B, T).astype(jnp.float32).sum(),
            argnums=(0, 1, 2))), (h, params[p0 + "attn.qkv.weight"], params[p0 + "attn.proj.weight"])),
        "mlp fwd+bwd (x n_layers)": (arch.n_layers, jax.jit(jax.grad(
            lambda h, a, b: jm.mlp(h, a, b, arch, dtype).astype(jnp.float32).sum(), argnums=(0, 1, 2))),
            (h, params[p0 + "mlp.fc.weight"], params[p0 + "mlp.proj.weight"])),
        "layernorm fwd+bwd (x 2 n_layers + 1)": (2 * arch.n_layers + 1, jax.jit(jax.grad(
            lambda h, g: jm.layernorm(h, g).astype(jnp.float32).sum(), argnums=(0, 1))), (h, params["ln_f.weight"])),
        "head + cross-entropy fwd+bwd": (1, jax.jit(jax.grad(
            lambda h, w: jm.head_cross_entropy(h, w.astype(dtype), ids.reshape(-1)), argnums=(0, 1))),
            (h, params["wte.weight"])),
    }
    trainer = jm.Trainer(arch, init_params(config), config["optimizer"], LR[config["optimizer"]],
                         config["precision"], jit=True)
    x = np.asarray(ids)[None]
    whole = timeit(lambda: trainer.step(x, x))
    print(f"\n== jax (jit): {whole * 1e3:.0f} ms per step; parts, each jit-compiled alone (median of {steps}):")
    total = 0.0
    for label, (times, fn, args) in parts.items():
        s = timeit(fn, *args) * times
        total += s
        print(f"  {s * 1e3:8.1f} ms {s / whole:6.1%}  {label}")
    print(f"  {(whole - total) * 1e3:8.1f} ms {(whole - total) / whole:6.1%}  the rest: embedding, residual adds, "
          f"optimizer update, dispatch")
    lowered = jax.jit(lambda p, x, y: jax.value_and_grad(jm.loss_fn)(p, x, y, arch, layout, dtype)).lower(
        params, ids, ids)
    cost = lowered.compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    if cost and "flops" in cost:
        print(f"  XLA's count: {cost['flops'] / 1e9:.1f} GFLOP per forward + backward "
              f"({cost['flops'] / whole / 1e9:.0f} GFLOP/s over the whole step); GEMMs by our count "
              f"{gemm_flops(config) / 1e9:.1f} GFLOP")


def profile_torch(config: dict, steps: int) -> None:
    """torch.profiler's operators by self CPU time over `steps` steps."""
    import torch

    step = torch_step(config)
    data = batches(config, steps + 2)
    for x, y in data[:2]:
        step(x, y)
    t = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for x, y in data[2:]:
            step(x, y)
    total = time.perf_counter() - t
    print(f"\n== torch (eager): {total / steps * 1e3:.0f} ms per step under the profiler; top operators by self CPU:")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=40))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8, help="timed steps per child")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--frameworks", default=",".join(DEFAULT_FRAMEWORKS),
                    help=f"comma-separated, from {FRAMEWORKS}")
    ap.add_argument("--set", action="append", default=[], metavar="K=V", help="override a config value")
    ap.add_argument("--profile", action="store_true", help="profile each framework instead of comparing")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        print(json.dumps(child(args.child, json.loads(args.config), args.warmup, args.steps)))
        return
    config = dict(D256)
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in config:
            raise SystemExit(f"--set {item}: unknown key {key!r} (known: {', '.join(config)})")
        config[key] = type(config[key])(value) if not isinstance(config[key], bool) else value == "true"
    names = [n.strip() for n in args.frameworks.split(",") if n.strip()]
    unknown = set(names) - set(FRAMEWORKS)
    if unknown:
        raise SystemExit(f"--frameworks: unknown {sorted(unknown)} (known: {', '.join(FRAMEWORKS)})")
    if args.profile:
        for name, fn in (("torch", profile_torch), ("numpy", profile_numpy), ("jax", profile_jax)):
            if name in names:
                # each in its own process, like the comparison
                subprocess.run([sys.executable, "-c", f"import sys; sys.argv=['x']; sys.path.insert(0, {str(ROOT)!r});"
                                f"import benchmarks.frameworks as f, json; f.{fn.__name__}("
                                f"json.loads({json.dumps(json.dumps(config))}), {args.steps})"], cwd=ROOT, check=True)
        return
    compare(config, names, args.rounds, args.warmup, args.steps)


if __name__ == "__main__":
    main()
