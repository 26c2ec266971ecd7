"""torch, JAX and NumPy train the same model: same weights from the seed, same losses, same gradients.

Tiny shapes (d_model 32, 2 layers, seq 32); fp32 throughout. The torch side is the torch trainer's
own model and optimizer code; JAX and NumPy start from the shared init (worker/trainers/params.py)
and see the same batches.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from worker.trainers.torch.model import GPT, ModelConfig
from common.variables import LR_OF as LR
from worker.trainers.torch.train import make_optimizer, make_step
from worker.trainers.jax import model as jax_model
from worker.trainers.masks import block_layout, dense_mask
from worker.trainers.numpy.model import GPT as NumpyGPT
from worker.trainers.numpy.model import normal_cdf_pdf
from worker.trainers.numpy.optim import FlatParams
from worker.trainers.numpy.step import Trainer as NumpyTrainer
from worker.trainers.params import Arch, count, init_params, param_shapes, torch_state_dict

pytestmark = pytest.mark.trainer

TINY = dict(vocab_size=64, seq_len=32, n_layers=2, d_model=32, n_heads=4, head_dim=8, kv_heads=4, mlp_ratio=4.0,
            activation="gelu", attention="full", window=8, dropout=0.0, attn_backend="sdpa", precision="fp32",
            seed=3)
BATCH = 3
VARIANTS = [{}, {"kv_heads": 2}, {"kv_heads": 1, "head_dim": 16}, {"activation": "relu"}, {"activation": "silu"},
            {"activation": "swiglu"}, {"attention": "local"}, {"attention": "sliding"},
            {"attention": "local", "window": 5}, {"attention": "sliding", "window": 7, "kv_heads": 2}]


def ids(variant: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in variant.items()) or "base"


def batches(config: dict, n: int, seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    """n micro-batches of (BATCH, seq_len) inputs and targets: (n, BATCH, T) each, int32, cut from a
    text that repeats a 40-token phrase: learnable, so the loss visibly falls in ten steps."""
    rng = np.random.default_rng(seed)
    T = config["seq_len"]
    text = np.tile(rng.integers(0, config["vocab_size"], 40), 8 + T // 40)
    starts = rng.integers(0, len(text) - T - 1, (n, BATCH))
    windows = text[starts[..., None] + np.arange(T + 1)].astype(np.int32)  # (n, BATCH, T + 1)
    return windows[:, :, :-1], windows[:, :, 1:]


def torch_model(config: dict) -> GPT:
    model = GPT(ModelConfig.from_config(config))
    model.load_state_dict(torch_state_dict(init_params(config)))
    return model.train()


def torch_losses(config: dict, optimizer: str, xs, ys) -> list[float]:
    model = torch_model(config)
    step = make_step(model, make_optimizer(model, {"optimizer": optimizer}, LR[optimizer]), "fp32")
    return [float(step([(torch.from_numpy(x).long(), torch.from_numpy(y).long())])) for x, y in zip(xs, ys)]


def numpy_losses(config: dict, optimizer: str, xs, ys) -> list[float]:
    trainer = NumpyTrainer(Arch.from_config(config), init_params(config), optimizer, LR[optimizer], BATCH)
    return [trainer.step(x[None], y[None]) for x, y in zip(xs, ys)]


def jax_losses(config: dict, optimizer: str, xs, ys, jit: bool = True, precision: str = "fp32") -> list[float]:
    trainer = jax_model.Trainer(Arch.from_config(config), init_params(config), optimizer, LR[optimizer],
                                precision, jit)
    return [float(trainer.step(x[None], y[None])) for x, y in zip(xs, ys)]


def torch_grads(config: dict, x, y) -> tuple[float, dict[str, np.ndarray]]:
    model = torch_model(config)
    _, loss = model(torch.from_numpy(x).long(), torch.from_numpy(y).long())
    loss.backward()
    return loss.item(), {k: p.grad.numpy() for k, p in model.named_parameters()}


def assert_grads_close(got: dict, want: dict, rtol: float = 1e-5) -> None:
    assert set(got) == set(want)
    for name in want:
        scale = np.abs(want[name]).max()
        err = np.abs(np.asarray(got[name]) - want[name]).max()
        assert err <= rtol * scale, f"{name}: max error {err:.3g} against max |grad| {scale:.3g}"


# -- one initialisation for every framework ------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS + [{"n_layers": 1, "mlp_ratio": 2.0, "vocab_size": 100}], ids=ids)
def test_shared_init_has_the_torch_models_names_and_shapes(variant):
    config = TINY | variant
    model = GPT(ModelConfig.from_config(config))
    state = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert state.pop("head.weight") == state["wte.weight"]  # tied: not a parameter of its own
    assert param_shapes(Arch.from_config(config)) == state
    assert count(init_params(config)) == sum(p.numel() for p in model.parameters())


def test_shared_init_is_gpt2s_distribution_and_depends_on_the_seed_only():
    config = TINY | {"d_model": 64, "n_layers": 4, "vocab_size": 512}
    params = init_params(config)
    assert all(a.dtype == np.float32 for a in params.values())
    assert np.std(params["wte.weight"]) == pytest.approx(0.02, rel=0.05)
    assert np.std(params["blocks.0.mlp.fc.weight"]) == pytest.approx(0.02, rel=0.05)
    assert np.std(params["blocks.3.mlp.proj.weight"]) == pytest.approx(0.02 / math.sqrt(8), rel=0.05)
    assert np.std(params["blocks.1.attn.proj.weight"]) == pytest.approx(0.02 / math.sqrt(8), rel=0.05)
    assert np.all(params["blocks.2.ln1.weight"] == 1.0) and np.all(params["ln_f.weight"] == 1.0)
    again, other = init_params(config), init_params(config | {"seed": 4})
    assert all(np.array_equal(params[k], again[k]) for k in params)
    assert not np.array_equal(params["wte.weight"], other["wte.weight"])
    # a layer's weights do not depend on how many layers come after it
    deeper = init_params(config | {"n_layers": 5})
    assert np.array_equal(deeper["blocks.0.attn.qkv.weight"], params["blocks.0.attn.qkv.weight"])


def test_torch_model_loads_the_shared_init_with_the_head_still_tied():
    config = TINY
    model = torch_model(config)
    params = init_params(config)
    assert np.array_equal(model.blocks[1].mlp.fc.weight.detach().numpy(), params["blocks.1.mlp.fc.weight"])
    assert model.head.weight is model.wte.weight
    assert np.array_equal(model.head.weight.detach().numpy(), params["wte.weight"])


# -- attention blocks: the dense rule, less work -------------------------------------------------


@pytest.mark.parametrize("kind", ["full", "local", "sliding"])
@pytest.mark.parametrize("seq_len, window", [(32, 8), (32, 5), (17, 4), (16, 16), (9, 1), (32, 31)])
def test_block_layout_allows_exactly_the_pairs_of_the_dense_mask(kind, seq_len, window):
    layout = block_layout(kind, seq_len, window)
    dense = np.zeros((layout.padded_len, layout.padded_len), bool)
    mask = layout.mask()  # (n, W, K)
    for b in range(layout.n_blocks):
        for r in range(layout.block):
            for c in range(layout.keys):
                j = (b - layout.key_blocks + 1) * layout.block + c
                if mask[b, r, c]:
                    assert j >= 0
                    dense[b * layout.block + r, j] = True
    assert np.array_equal(dense[:seq_len, :seq_len], dense_mask(kind, seq_len, window))
    assert not dense[:seq_len, seq_len:].any()  # padding is never seen by a real query
    assert mask.any(axis=-1).all()  # every query, padded or not, sees at least itself: no NaN rows


def test_local_and_sliding_attention_compute_fewer_pairs_as_the_window_shrinks():
    full = block_layout("full", 256, 64).pairs()
    for kind in ("local", "sliding"):
        pairs = [block_layout(kind, 256, w).pairs() for w in (128, 64, 32, 16)]
        assert pairs == sorted(pairs, reverse=True) and len(set(pairs)) == 4, (kind, pairs)
        assert pairs[0] <= full
    assert block_layout("local", 256, 32).pairs() == 256 * 32
    assert block_layout("sliding", 256, 32).pairs() == 256 * 64


# -- gradients against torch autograd --------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS, ids=ids)
def test_numpy_gradients_equal_torch_autograd(variant):
    config = TINY | variant
    xs, ys = batches(config, 1)
    want_loss, want = torch_grads(config, xs[0], ys[0])
    flat = FlatParams(init_params(config))
    loss = NumpyGPT(Arch.from_config(config), BATCH).loss_and_grads(flat.params, flat.grads, xs[0], ys[0])
    assert loss == pytest.approx(want_loss, abs=1e-5)
    assert_grads_close(flat.grads, want)


@pytest.mark.parametrize("variant", VARIANTS, ids=ids)
def test_jax_gradients_equal_torch_autograd(variant):
    config = TINY | variant
    arch = Arch.from_config(config)
    xs, ys = batches(config, 1)
    want_loss, want = torch_grads(config, xs[0], ys[0])
    loss, grads = jax.jit(jax.value_and_grad(jax_model.loss_fn), static_argnums=(3, 4, 5))(
        jax_model.to_device(init_params(config), "fp32"), jnp.asarray(xs[0]), jnp.asarray(ys[0]), arch,
        block_layout(arch.attention, arch.seq_len, arch.window), jnp.float32)
    assert float(loss) == pytest.approx(want_loss, abs=1e-5)
    assert_grads_close({k: np.asarray(v) for k, v in grads.items()}, want)


def test_numpy_normal_cdf_is_accurate_to_float32_noise():
    x = np.linspace(-9, 9, 100_001, dtype=np.float32)
    cdf, pdf = normal_cdf_pdf(x)
    want = np.array([0.5 * math.erfc(-float(v) / math.sqrt(2)) for v in x])
    assert np.abs(cdf - want).max() < 5e-7
    assert np.abs(pdf - np.exp(-x.astype(np.float64) ** 2 / 2) / math.sqrt(2 * math.pi)).max() < 1e-7


def test_numpy_dropout_gradient_matches_finite_differences():
    config = TINY | {"dropout": 0.3, "n_layers": 1, "vocab_size": 32}
    arch = Arch.from_config(config)
    xs, ys = batches(config, 1)
    model = NumpyGPT(arch, BATCH)

    def loss_and_grads(params):
        flat = FlatParams(params)
        loss = model.loss_and_grads(flat.params, flat.grads, xs[0], ys[0], np.random.default_rng(5))
        return loss, flat.grads

    params = {k: v.astype(np.float32) for k, v in init_params(config).items()}
    _, grads = loss_and_grads(params)
    nodrop = FlatParams(params)
    model.loss_and_grads(nodrop.params, nodrop.grads, xs[0], ys[0])
    assert not np.allclose(grads["blocks.0.mlp.fc.weight"], nodrop.grads["blocks.0.mlp.fc.weight"])
    rng = np.random.default_rng(0)
    for name in ("blocks.0.attn.qkv.weight", "blocks.0.mlp.fc.weight", "wte.weight", "wpe.weight"):
        index = tuple(rng.integers(0, s) for s in params[name].shape)
        eps = 1e-2
        up, down = dict(params), dict(params)
        up[name], down[name] = params[name].copy(), params[name].copy()
        up[name][index] += eps
        down[name][index] -= eps
        numeric = (loss_and_grads(up)[0] - loss_and_grads(down)[0]) / (2 * eps)
        assert grads[name][index] == pytest.approx(numeric, abs=2e-4, rel=0.05), name


# -- training: the same losses step after step ---------------------------------------------------


@pytest.mark.parametrize("variant", [{}, {"kv_heads": 2, "activation": "swiglu"}, {"attention": "sliding"}],
                         ids=ids)
def test_first_loss_and_ten_sgd_steps_agree_across_torch_jax_and_numpy(variant):
    config = TINY | variant
    xs, ys = batches(config, 10)
    want = torch_losses(config, "sgd", xs, ys)
    got_numpy = numpy_losses(config, "sgd", xs, ys)
    got_jax = jax_losses(config, "sgd", xs, ys)
    for got in (got_numpy, got_jax):
        assert got[0] == pytest.approx(want[0], abs=1e-4)
        assert got[-1] == pytest.approx(want[-1], abs=1e-3)
    assert want[-1] < want[0] - 0.05  # it trained: the agreement is not of a model standing still


def test_ten_adamw_steps_agree_across_torch_jax_and_numpy():
    config = TINY | {"activation": "silu", "kv_heads": 2}
    xs, ys = batches(config, 10)
    want = torch_losses(config, "adamw", xs, ys)
    for got in (numpy_losses(config, "adamw", xs, ys), jax_losses(config, "adamw", xs, ys)):
        assert np.allclose(got, want, atol=1e-4), (got, want)
    assert want[-1] < want[0] - 0.05


def test_jax_eager_and_jit_train_the_same():
    config = TINY | {"attention": "local", "n_layers": 1}
    xs, ys = batches(config, 3)
    assert np.allclose(jax_losses(config, "adamw", xs, ys, jit=False),
                       jax_losses(config, "adamw", xs, ys, jit=True), atol=1e-5)


@pytest.mark.parametrize("precision", ["bf16", "mixed"])
def test_jax_bf16_and_mixed_train_close_to_fp32(precision):
    config = TINY | {"n_layers": 1}
    xs, ys = batches(config, 5)
    fp32 = jax_losses(config, "adamw", xs, ys)
    low = jax_losses(config, "adamw", xs, ys, precision=precision)
    assert np.all(np.isfinite(low))
    assert np.allclose(low, fp32, atol=0.05), (low, fp32)
    assert low != fp32  # it really computed in bf16


def test_grad_accumulation_equals_one_big_batch_in_numpy_and_jax():
    config = TINY | {"n_layers": 1}
    arch = Arch.from_config(config)
    xs, ys = batches(config, 2)
    big = NumpyTrainer(arch, init_params(config), "sgd", 0.05, 2 * BATCH)
    split = NumpyTrainer(arch, init_params(config), "sgd", 0.05, BATCH)
    big.step(xs.reshape(1, 2 * BATCH, -1), ys.reshape(1, 2 * BATCH, -1))
    split.step(xs, ys)
    assert all(np.allclose(big.params[k], split.params[k], atol=1e-6) for k in big.params)
    jbig = jax_model.Trainer(arch, init_params(config), "sgd", 0.05, "fp32", True)
    jsplit = jax_model.Trainer(arch, init_params(config), "sgd", 0.05, "fp32", True)
    jbig.step(xs.reshape(1, 2 * BATCH, -1), ys.reshape(1, 2 * BATCH, -1))
    jsplit.step(xs, ys)
    a, b = jbig.numpy_params(), jsplit.numpy_params()
    assert all(np.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert all(np.allclose(a[k], big.params[k], atol=1e-5) for k in a)
    eager = jax_model.Trainer(arch, init_params(config), "sgd", 0.05, "fp32", False)  # a Python loop, no scan
    eager.step(xs, ys)
    c = eager.numpy_params()
    assert all(np.allclose(c[k], b[k], atol=1e-6) for k in c)


@pytest.mark.parametrize("module, banned", [("worker.trainers.jax.model", ("torch",)),
                                            ("worker.trainers.numpy.step", ("torch", "jax"))])
def test_a_trainer_never_imports_another_frameworks_runtime(module, banned):
    import subprocess
    import sys
    from pathlib import Path

    code = f"import sys, {module}; print(','.join(m for m in {banned!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == ""
