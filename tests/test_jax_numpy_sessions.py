"""The JAX and NumPy children's framework halves: refusals with reasons, training steps, the sync
hook, the read-back, and weights saved by one framework that the other can start from."""

import numpy as np
import pytest

from worker.trainers.jax import session as jax_child
from worker.trainers.numpy import session as numpy_child
from worker.trainers.params import load_params

pytestmark = pytest.mark.trainer

CONFIG = dict(vocab_size=64, seq_len=32, n_layers=1, d_model=32, n_heads=4, head_dim=8, kv_heads=2, mlp_ratio=4.0,
              activation="gelu", attention="sliding", window=8, dropout=0.0, precision="fp32", compile="eager",
              optimizer="adamw", batch_size=2, seed=0, cores=2, intra_threads=2, omp_threads=2)
CHILDREN = {"numpy": numpy_child, "jax": jax_child}


def micro_batches(n: int, accum: int = 1):
    rng = np.random.default_rng(0)
    text = np.tile(rng.integers(0, 64, 20), 10)
    for _ in range(n):
        starts = rng.integers(0, len(text) - 33, (accum, 2))
        w = text[starts[..., None] + np.arange(33)].astype(np.int32)
        yield [(w[i, :, :-1], w[i, :, 1:]) for i in range(accum)]


@pytest.mark.parametrize("framework, change, words", [
    ("numpy", {"precision": "bf16"}, "fp32 only"),
    ("numpy", {"compile": "xla"}, "no compiler"),
    ("jax", {"precision": "q8"}, "precision=q8"),
    ("jax", {"compile": "inductor"}, "compile=inductor"),
    ("jax", {"intra_threads": 1}, "thread pool from the CPU affinity"),
])
def test_a_setting_the_framework_cannot_honour_is_refused_with_its_reason(framework, change, words):
    assert CHILDREN[framework].unsupported(CONFIG) is None
    reason = CHILDREN[framework].unsupported(CONFIG | change)
    assert reason and words in reason


@pytest.mark.parametrize("framework, compile_", [("numpy", "eager"), ("jax", "xla"), ("jax", "eager")])
def test_a_session_trains_reads_back_and_saves(framework, compile_, tmp_path):
    config = CONFIG | {"compile": compile_}
    assert CHILDREN[framework].unsupported(config) is None
    session = CHILDREN[framework].Session(config, lr=1e-2)
    losses = [session.sync(session.step(mb)) for mb in micro_batches(12, accum=2)]
    assert all(isinstance(v, float) for v in losses)
    assert losses[-1] < losses[0] - 0.3
    applied = session.read_back()
    assert applied["affinity"] and applied["lr"] == 1e-2
    assert applied["jit"] is (compile_ == "xla")
    if framework == "jax":
        assert applied["xla_threads"] >= 1 and applied["compute_dtype"] == "float32"
    else:
        assert applied["blas"] == "openblas" and applied["blas_threads"] == 2
    assert session.build_info()["framework"].startswith(framework)
    path = session.save(tmp_path)
    saved = load_params(path)
    assert all(np.array_equal(saved[k], v) for k, v in session.params().items())


def test_jax_step_returns_before_the_work_is_done_and_sync_waits_for_it():
    import jax

    session = jax_child.Session(CONFIG | {"compile": "xla"}, lr=1e-3)
    loss = session.step(next(micro_batches(1)))
    assert isinstance(loss, jax.Array)  # not a float: the harness's sync hook must wait inside the timed step
    assert np.isfinite(session.sync(loss))


def test_weights_saved_by_numpy_start_a_jax_run_with_the_same_loss(tmp_path):
    trained = numpy_child.Session(CONFIG, lr=1e-2)
    for mb in micro_batches(5):
        trained.step(mb)
    params = load_params(trained.save(tmp_path))
    probe = next(micro_batches(1, accum=1))
    from_numpy = numpy_child.Session(CONFIG, lr=0.0, params=params)
    from_jax = jax_child.Session(CONFIG | {"compile": "xla"}, lr=0.0, params=params)
    fresh = numpy_child.Session(CONFIG, lr=0.0)
    a, b, c = (s.sync(s.step(probe)) for s in (from_numpy, from_jax, fresh))
    assert a == pytest.approx(b, abs=1e-5)
    assert abs(a - c) > 1e-3  # the saved weights were used, not a fresh init
