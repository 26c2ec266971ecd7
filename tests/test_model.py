"""The model honours every architecture variable; attention kernels agree; masks never leak."""

import pytest
import torch

from worker.trainers.torch.model import GPT, ModelConfig, attention_mask, count_params, flops_per_step, matmul_params
from worker.trainers.torch.quant import QuantLinear

TINY = dict(vocab_size=64, seq_len=32, n_layers=1, d_model=32, n_heads=4, head_dim=8, kv_heads=4, window=8)


def tiny(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(**(TINY | overrides)))


def tokens(batch=2, T=32, seed=1):
    return torch.randint(0, 64, (batch, T), generator=torch.Generator().manual_seed(seed))


def test_kv_heads_shrink_the_key_value_projection_and_the_parameter_count():
    mha, gqa, mqa = tiny(kv_heads=4), tiny(kv_heads=2), tiny(kv_heads=1)
    assert mha.blocks[0].attn.qkv.weight.shape == (4 * 8 + 2 * 4 * 8, 32)
    assert gqa.blocks[0].attn.qkv.weight.shape == (4 * 8 + 2 * 2 * 8, 32)
    assert mqa.blocks[0].attn.qkv.weight.shape == (4 * 8 + 2 * 1 * 8, 32)
    assert count_params(mha) > count_params(gqa) > count_params(mqa)


def test_head_dim_sets_the_attention_width_independently_of_d_model():
    model = tiny(head_dim=16)  # 4 heads x 16 = 64 wide attention in a 32 wide model
    assert model.blocks[0].attn.qkv.weight.shape == (3 * 64, 32)
    assert model.blocks[0].attn.proj.weight.shape == (32, 64)
    assert model(tokens()).shape == (2, 32, 64)


@pytest.mark.parametrize("name, value", [("n_layers", 2), ("d_model", 48), ("mlp_ratio", 2.0),
                                         ("vocab_size", 128), ("seq_len", 64), ("n_heads", 8)])
def test_each_shape_variable_changes_the_parameter_count(name, value):
    assert count_params(tiny(**{name: value})) != count_params(tiny())


def test_activation_changes_the_mlp_and_its_output():
    x = tokens()
    outputs = {act: tiny(activation=act)(x) for act in ("gelu", "relu", "silu", "swiglu")}
    names = list(outputs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not torch.allclose(outputs[a], outputs[b]), (a, b)


def test_swiglu_hidden_width_is_two_thirds_so_parameters_stay_comparable():
    swiglu, gelu = tiny(activation="swiglu"), tiny(activation="gelu")
    hidden = int(2 / 3 * 4.0 * 32)
    assert swiglu.blocks[0].mlp.fc.weight.shape == (2 * hidden, 32)
    assert swiglu.blocks[0].mlp.proj.weight.shape == (32, hidden)
    ratio = count_params(swiglu.blocks[0].mlp) / count_params(gelu.blocks[0].mlp)
    assert 0.95 < ratio < 1.05


def test_masks_never_see_the_future_local_never_crosses_blocks_sliding_never_beyond_window():
    T, w = 32, 8
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    for kind in ("full", "local", "sliding"):
        assert not attention_mask(kind, T, w)[j > i].any(), kind
    assert attention_mask("full", T, w)[j <= i].all()
    local = attention_mask("local", T, w)
    assert not local[(i // w) != (j // w)].any()
    assert local[((i // w) == (j // w)) & (j <= i)].all()
    sliding = attention_mask("sliding", T, w)
    assert not sliding[(i - j) >= w].any()
    assert sliding[((i - j) < w) & (j <= i)].all()
    assert sliding.sum(1).max() == w  # each token sees itself and the w-1 before it


@pytest.mark.parametrize("backend", ["manual", "sdpa", "sdpa_math"])
@pytest.mark.parametrize("kind", ["full", "local", "sliding"])
def test_a_changed_token_only_changes_the_outputs_allowed_to_see_it(kind, backend):
    model = tiny(attention=kind, attn_backend=backend).eval()
    x = tokens()
    changed = x.clone()
    changed[:, 12] = (changed[:, 12] + 1) % 64
    moved = (model(x) - model(changed)).abs().amax(dim=(0, 2)) > 1e-6  # (T,) which positions changed
    expected = attention_mask(kind, 32, 8)[:, 12]  # positions whose mask lets them see token 12
    expected[12] = True
    assert torch.equal(moved, expected)


@pytest.mark.parametrize("kind", ["local", "sliding"])
def test_windowed_attention_changes_the_output_against_full(kind):
    x = tokens()
    assert not torch.allclose(tiny(attention=kind)(x), tiny(attention="full")(x))


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("kind", ["full", "local", "sliding"])
def test_attention_backends_agree_on_outputs_and_gradients(kind, kv_heads):
    x, y = tokens(), tokens(seed=2)
    results = {}
    for backend in ("manual", "sdpa", "sdpa_math"):
        model = tiny(attention=kind, kv_heads=kv_heads, attn_backend=backend)
        logits, loss = model(x, y)
        loss.backward()
        results[backend] = (logits, model.blocks[0].attn.qkv.weight.grad)
    for backend in ("sdpa", "sdpa_math"):
        torch.testing.assert_close(results[backend][0], results["manual"][0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(results[backend][1], results["manual"][1], rtol=1e-3, atol=1e-5)


def test_dropout_makes_two_training_calls_differ_and_eval_calls_equal():
    x = tokens()
    model = tiny(dropout=0.2).train()
    assert not torch.allclose(model(x), model(x))
    model.eval()
    assert torch.equal(model(x), model(x))
    no_dropout = tiny(dropout=0.0).train()
    assert torch.equal(no_dropout(x), no_dropout(x))


@pytest.mark.parametrize("mode, levels", [("q8", 256), ("q4", 16), ("bitnet", 3)])
def test_quantized_weights_and_inputs_take_few_values_per_channel_or_tensor(mode, levels):
    torch.manual_seed(0)
    layer = QuantLinear(1024, 4, bias=False, mode=mode)
    w = layer.quantized_weight().detach()  # what the matmul sees
    rows = [w] if mode == "bitnet" else list(w)  # bitnet: one scale per tensor; q8/q4: per channel
    assert all(len(torch.unique(r)) <= levels for r in rows)
    assert all(len(torch.unique(r)) < len(torch.unique(raw)) for r, raw in zip(rows, layer.weight))
    x = torch.randn(3, 1024)
    xq = layer.quantized_input(x).detach()
    groups = list(xq) if mode == "bitnet" else [xq]  # bitnet: per token; q8/q4: per tensor
    act_levels = 16 if mode == "q4" else 256
    assert all(len(torch.unique(g)) <= act_levels for g in groups)


@pytest.mark.parametrize("mode, kind", [("q8", "QuantLinear"), ("q4", "Int4Linear"), ("bitnet", "Int8Linear"),
                                        ("int8", "Int8Linear")])
def test_gradients_flow_through_every_quantized_layer(mode, kind):
    model = tiny(precision=mode)
    layers = [m for m in model.blocks.modules() if type(m).__name__ == kind]
    assert len(layers) == 4  # qkv, attention proj, mlp fc, mlp proj
    _, loss = model(tokens(), tokens(seed=2))
    loss.backward()
    assert all(m.weight.grad is not None and m.weight.grad.abs().sum() > 0 for m in layers)


def test_quantized_model_output_differs_from_the_float_one():
    x = tokens()
    assert not torch.allclose(tiny(precision="q4")(x), tiny(precision="fp32")(x))


def test_the_loss_and_its_gradient_equal_torch_cross_entropy():
    from worker.trainers.torch.model import CrossEntropy

    logits = torch.randn(40, 64, requires_grad=True)
    targets = torch.randint(0, 64, (40,))
    ours = CrossEntropy.apply(logits, targets)
    (ours_grad,) = torch.autograd.grad(ours, logits)
    reference = torch.nn.functional.cross_entropy(logits, targets)
    (reference_grad,) = torch.autograd.grad(reference, logits)
    torch.testing.assert_close(ours, reference)
    torch.testing.assert_close(ours_grad, reference_grad)


@pytest.mark.parametrize("lora", [False, True])  # LoRA: the tied head is frozen, no dw
@pytest.mark.parametrize("chunk", [7, 64, 4096])  # a ragged last chunk, exact chunks, one chunk
@pytest.mark.parametrize("scale", [1.0, 0.5])  # 0.5: a scaled loss, as under grad_accum
def test_the_chunked_head_loss_equals_the_logits_loss_and_its_gradients(chunk, lora, scale, monkeypatch):
    from worker.trainers.torch.model import HeadCrossEntropy, add_lora

    monkeypatch.setattr(HeadCrossEntropy, "CHUNK", chunk)
    x, y = tokens(), tokens(seed=2)
    results = []
    for return_logits in (True, False):
        model = tiny(n_layers=2)
        if lora:
            add_lora(model, 4)
            torch.nn.init.normal_(model.blocks[1].mlp.proj.lora_b)  # nonzero: gradients reach lora_a
        logits, loss = model(x, y, return_logits=return_logits)
        (scale * loss).backward()  # 1.0: backward returns the saved products, else scales them
        results.append((logits, loss, {n: p.grad for n, p in model.named_parameters()}))
    (logits, plain, plain_grads), (none, fused, fused_grads) = results
    assert logits is not None and none is None
    torch.testing.assert_close(fused, plain, rtol=1e-6, atol=1e-6)
    assert [n for n, g in fused_grads.items() if g is None] == [n for n, g in plain_grads.items() if g is None]
    assert (model.wte.weight.grad is None) == lora
    for name, grad in plain_grads.items():
        if grad is not None:
            torch.testing.assert_close(fused_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_the_chunked_head_gradients_add_up_over_a_retained_graph():
    # backward returns its saved products under a unit gradient: a second pass must not double them
    x, y = tokens(), tokens(seed=2)
    grads = []
    for return_logits in (True, False):
        model = tiny()
        _, loss = model(x, y, return_logits=return_logits)
        for retain in (True, True, False):
            loss.backward(retain_graph=retain)
        grads.append(model.wte.weight.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)


def test_the_chunked_head_loss_is_only_taken_where_it_is_exact():
    x, y = tokens(), tokens(seed=2)
    bf16 = tiny().to(torch.bfloat16)
    assert bf16(x, y, return_logits=False)[0] is not None  # bf16: logits path (dw rounded once)
    with torch.no_grad():
        assert tiny()(x, y, return_logits=False)[0] is not None  # no gradient to compute
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert tiny()(x, y, return_logits=False)[0] is not None


@pytest.mark.parametrize("backend", ["manual", "sdpa", "sdpa_math"])
@pytest.mark.parametrize("kind", ["local", "sliding"])
@pytest.mark.parametrize("T, window, kv_heads", [(32, 8, 4), (30, 8, 2), (29, 7, 1), (12, 16, 4), (16, 1, 2)])
def test_blocked_attention_equals_dense_masked_attention_outputs_and_gradients(kind, backend, T, window, kv_heads):
    """windowed_attention (blocks of `window`) against dense attention under the full T x T mask:
    T not a multiple of the window (padded last block), the window past T, GQA/MQA, every backend."""
    from worker.trainers.torch.model import attend, windowed_attention

    g = torch.Generator().manual_seed(T * window + kv_heads)
    q = torch.randn(2, T, 4, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, T, kv_heads, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, T, kv_heads, 8, generator=g, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(2, T, 4, 8, generator=g, dtype=torch.float64)
    blocked = windowed_attention(q, k, v, kind, window, 0.0, backend)
    dense = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attention_mask(kind, T, window),
                   False, 0.0, "manual").transpose(1, 2)
    torch.testing.assert_close(blocked, dense)
    grads_blocked = torch.autograd.grad((blocked * upstream).sum(), (q, k, v))
    grads_dense = torch.autograd.grad((dense * upstream).sum(), (q, k, v))
    for gb, gd in zip(grads_blocked, grads_dense):
        torch.testing.assert_close(gb, gd)


@pytest.mark.parametrize("kind", ["local", "sliding"])
def test_blocked_attention_in_bf16_stays_near_the_fp32_dense_reference(kind):
    from worker.trainers.torch.model import attend, windowed_attention

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 30, 4, 8, generator=g) for _ in range(3))
    blocked = windowed_attention(*(t.bfloat16() for t in (q, k, v)), kind, 8, 0.0, "sdpa")
    dense = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attention_mask(kind, 30, 8),
                   False, 0.0, "manual").transpose(1, 2)
    assert blocked.dtype == torch.bfloat16
    torch.testing.assert_close(blocked.float(), dense, rtol=3e-2, atol=3e-2)


def test_blocked_attention_with_dropout_drops_only_allowed_pairs():
    """Dropout on the blocks: calls differ, yet a changed future token still moves nothing before it."""
    model = tiny(attention="sliding", dropout=0.3, attn_backend="manual").train()
    x = tokens()
    torch.manual_seed(5)
    a = model(x)
    torch.manual_seed(6)
    assert not torch.allclose(a, model(x))
    changed = x.clone()
    changed[:, 20] = (changed[:, 20] + 1) % 64
    torch.manual_seed(5)
    b = model(changed)
    torch.testing.assert_close(a[:, :20], b[:, :20])


def test_lora_freezes_the_base_and_only_adapters_get_gradients():
    from worker.trainers.torch.model import LoRALinear, add_lora, trainable_params

    model = tiny()
    x, y = tokens(), tokens(seed=2)
    before, _ = model(x, y)
    add_lora(model, 4)
    after, loss = model(x, y)
    torch.testing.assert_close(after, before)  # B = 0: the adapted model starts as the base
    loss.backward()
    adapters = [m for m in model.modules() if isinstance(m, LoRALinear)]
    assert len(adapters) == 4
    assert all(m.lora_b.grad.abs().sum() > 0 for m in adapters)
    frozen = [p for n, p in model.named_parameters() if ".lora_" not in n]
    assert frozen and all(not p.requires_grad and p.grad is None for p in frozen)
    assert trainable_params(model) == sum(m.lora_a.numel() + m.lora_b.numel() for m in adapters)


def test_lora_flops_drop_the_frozen_weight_gradients_and_add_the_adapters():
    from worker.trainers.torch.model import add_lora

    full = tiny()
    lora = add_lora(tiny(), 4)
    tokens_ = 8 * 32
    attention = flops_per_step(full, 8, 1) - 6 * matmul_params(full) * tokens_
    qkv_0 = 96 * 32
    n_lora = 4 * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32))
    # merged adapters: 4 FLOPs per adapter weight per token, and the merge W + B A once per micro-batch
    merges = 2 * 4 * (96 * 32 + 32 * 32 + 128 * 32 + 32 * 128)
    expected = (4 * matmul_params(full) - 2 * qkv_0 + 4 * n_lora) * tokens_ + merges + attention
    assert flops_per_step(lora, 8, 1) == expected < flops_per_step(full, 8, 1)
    # two paths (quantized bases, autocast): 6 per adapter weight, less the first qkv adapter's input gradient
    two_paths = (4 * matmul_params(full) - 2 * qkv_0 + 6 * n_lora - 2 * 4 * 32) * tokens_ + attention
    assert flops_per_step(lora, 8, 1, merged=False) == two_paths


def test_lora_saved_state_merges_the_adapters_into_a_plain_gpt():
    from worker.trainers.torch.model import add_lora, plain_state_dict

    model = add_lora(tiny(), 4)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.normal_()
    x = tokens()
    plain = tiny()
    plain.load_state_dict(plain_state_dict(model))
    torch.testing.assert_close(plain(x), model(x), rtol=1e-4, atol=1e-4)


def test_int8_matmul_is_the_int32_product_of_rounded_inputs_and_weights_with_fp32_gradients():
    from worker.trainers.torch.quant import Int8Matmul

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 40, 64, generator=g, requires_grad=True)
    w = torch.randn(24, 64, generator=g, requires_grad=True)
    y = Int8Matmul.apply(x, w)
    sx = x.detach().abs().amax(-1, keepdim=True) / 127
    sw = w.detach().abs().amax(1) / 127
    xq, wq = torch.round(x.detach() / sx), torch.round(w.detach() / sw[:, None])
    assert xq.abs().max() <= 127 and wq.abs().max() <= 127
    torch.testing.assert_close(y, (xq @ wq.t()) * sx * sw)  # integer products, exact in fp32 here
    exact = x @ w.t()
    assert (y - exact).abs().max() < 0.03 * exact.abs().max()  # close to the fp32 product
    upstream = torch.randn(2, 40, 24, generator=g)
    gx, gw = torch.autograd.grad((y * upstream).sum(), (x, w))
    rx, rw = torch.autograd.grad((exact * upstream).sum(), (x, w))
    torch.testing.assert_close(gx, rx)  # backward in fp32 on the master weight: straight-through
    torch.testing.assert_close(gw, rw)


def test_int8_model_runs_int_mm_in_every_block_linear_and_learns():
    from torch.profiler import profile

    from worker.trainers.torch.quant import Int8Linear

    model = tiny(precision="int8")
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == 4
    x, y = tokens(), tokens(seed=2)
    with profile() as prof:
        model(x, y)
    assert sum(e.count for e in prof.key_averages() if e.key == "aten::_int_mm") == 4
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_merged_lora_equals_the_two_path_form_in_outputs_and_gradients():
    """MergedLoRA (x (W + B A)^T, the gradients LoRA needs) against x W^T + (x A^T) B^T: the same
    output, input gradient and adapter gradients, no gradient for the frozen W; gradcheck in float64."""
    from worker.trainers.torch.model import LoRALinear, MergedLoRA

    torch.manual_seed(0)
    base = torch.nn.Linear(32, 48, bias=False)
    m = LoRALinear(base, 4)
    torch.nn.init.normal_(m.lora_b)
    x = torch.randn(2, 5, 32, requires_grad=True)
    g = torch.randn(2, 5, 48)
    outs = {}
    for merged in (True, False):
        m.merged = merged
        x.grad = m.lora_a.grad = m.lora_b.grad = None
        y = m(x)
        y.backward(g)
        outs[merged] = (y.detach(), x.grad, m.lora_a.grad, m.lora_b.grad)
    for a, b in zip(outs[True], outs[False]):
        assert torch.allclose(a, b, atol=1e-5)
    assert base.weight.grad is None
    x64, w64 = torch.randn(3, 4, 6, dtype=torch.double, requires_grad=True), torch.randn(5, 6, dtype=torch.double)
    a64 = torch.randn(2, 6, dtype=torch.double, requires_grad=True)
    b64 = torch.randn(5, 2, dtype=torch.double, requires_grad=True)
    args = (x64, w64, a64, b64)
    assert torch.autograd.gradcheck(MergedLoRA.apply, args)


def test_bitnet_matmul_is_the_int32_product_of_ternary_weights_and_int8_inputs():
    from worker.trainers.torch.quant import Int8Matmul

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 40, 64, generator=g, requires_grad=True)
    w = torch.randn(24, 64, generator=g, requires_grad=True)
    y = Int8Matmul.apply(x, w, True)
    sx = x.detach().abs().amax(-1, keepdim=True) / 127
    sw = w.detach().abs().mean()
    xq, wq = torch.round(x.detach() / sx), torch.round(w.detach() / sw).clamp(-1, 1)
    assert set(wq.unique().tolist()) == {-1.0, 0.0, 1.0}
    torch.testing.assert_close(y, (xq @ wq.t()) * sx * sw)
    upstream = torch.randn(2, 40, 24, generator=g)
    gx, gw = torch.autograd.grad((y * upstream).sum(), (x, w))
    rx, rw = torch.autograd.grad(((x @ w.t()) * upstream).sum(), (x, w))
    torch.testing.assert_close(gx, rx)  # straight-through: the fp32 backward of the master weight
    torch.testing.assert_close(gw, rw)


def test_int4_matmul_multiplies_by_the_dequantized_int4_weight_with_fp32_gradients():
    from worker.trainers.harness import INT4_GROUP
    from worker.trainers.torch.quant import Int4Matmul

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 40, 64, generator=g, requires_grad=True)
    w = torch.randn(32, 64, generator=g, requires_grad=True)
    y = Int4Matmul.apply(x, w)
    wg = w.detach().reshape(32, 64 // INT4_GROUP, INT4_GROUP)  # the same grid by hand: 16 levels per group
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    scale = (hi - lo) / 15
    w4 = (torch.round((wg - lo) / scale) * scale + lo).reshape(32, 64)
    assert all(len(row.unique()) <= 16 for row in w4.reshape(-1, INT4_GROUP))
    exact = x.detach().bfloat16().float() @ w4.t()
    assert (y - exact).abs().max() < 0.02 * exact.abs().max()  # bf16 activations, bf16 scales
    assert (y - x.detach() @ w.detach().t()).abs().max() > 1e-3  # really rounded: not the fp32 product
    upstream = torch.randn(2, 40, 32, generator=g)
    gx, gw = torch.autograd.grad((y * upstream).sum(), (x, w))
    rx, rw = torch.autograd.grad(((x @ w.t()) * upstream).sum(), (x, w))
    torch.testing.assert_close(gx, rx)
    torch.testing.assert_close(gw, rw)


@pytest.mark.parametrize("mode, op", [("q4", "aten::_weight_int4pack_mm_for_cpu"), ("bitnet", "aten::_int_mm")])
def test_real_low_bit_modes_run_their_integer_kernel_in_every_block_linear(mode, op):
    from torch.profiler import profile

    model = tiny(precision=mode)
    with profile() as prof:
        model(tokens(), tokens(seed=2))
    assert sum(e.count for e in prof.key_averages() if e.key == op) == 4  # qkv, proj, fc, proj


def test_each_precision_says_what_its_gemms_compute_and_simulated_modes_say_so():
    from worker.trainers.torch.quant import gemm_format

    avx2 = {"avx2", "fma"}
    assert gemm_format("q8", avx2).startswith("q8 (simulated: fp32 GEMMs")
    assert "simulated" not in gemm_format("q4", avx2) and "int4" in gemm_format("q4", avx2)
    assert "ternary" in gemm_format("bitnet", avx2) and "(no VNNI/AMX here)" in gemm_format("bitnet", avx2)
    assert "(no VNNI/AMX here)" not in gemm_format("int8", avx2 | {"avx512_vnni"})
    assert "no AVX512_BF16" in gemm_format("bf16", avx2) and "no AVX512_BF16" not in gemm_format("bf16", {"amx_bf16"})
