import json

import pytest

from common import variables as V
from common.errors import BadInput


def test_every_variable_of_the_design_is_in_the_catalogue():
    design = """cores ranks nodes interconnect freq_mhz governor turbo pin_threads numa allocator omp_threads
    intra_threads inter_threads isa onednn framework compile fusion compile_cache cc_flags compiler blas attn_backend
    n_layers d_model
    n_heads head_dim kv_heads mlp_ratio dropout activation attention window vocab_size seq_len
    batch_size grad_accum precision optimizer lr lr_schedule task lora_rank steps warmup_steps max_tokens target_loss
    eval_every seed dataset repeat""".split()
    assert set(design) == set(V.NAMES)


def test_defaults_are_valid_values_of_their_own_variable():
    for var in V.CATALOGUE:
        assert var.parse(var.default) == var.default


@pytest.mark.parametrize("name, value", [("precision", "fp8"), ("n_layers", "two"), ("n_layers", 0),
                                         ("dropout", 1.5), ("pin_threads", "maybe"), ("d_model", 3.5)])
def test_invalid_values_are_rejected_naming_the_variable(name, value):
    with pytest.raises(BadInput, match=name):
        V.parse_value(name, value, "x.toml")


def test_unknown_variable_is_rejected_with_a_hint():
    with pytest.raises(BadInput, match="unknown variable 'd_modle'.*d_model"):
        V.lookup("d_modle")


def test_auto_values_resolve_against_the_machine_and_other_variables():
    config, why = V.resolve({"cores": "all", "d_model": 96, "n_heads": 3}, cpu_count=6)
    assert why == []
    assert config["cores"] == config["omp_threads"] == config["intra_threads"] == config["inter_threads"] == 6
    assert config["head_dim"] == 32 and config["kv_heads"] == 3


def test_two_spellings_of_one_run_hash_alike():
    a, _ = V.resolve({"head_dim": "auto"}, 2)
    b, _ = V.resolve({"head_dim": 32, "cores": 2}, 2)
    assert V.config_hash(a) == V.config_hash(b)


@pytest.mark.parametrize("partial, reason", [
    ({"d_model": 100, "n_heads": 3}, "d_model not divisible by n_heads"),
    ({"n_heads": 4, "kv_heads": 3}, "kv_heads does not divide n_heads"),
    ({"n_heads": 4, "kv_heads": 8}, "kv_heads greater than n_heads"),
    ({"cores": 64}, "cores greater than"),
    ({"fusion": False}, "fusion=off needs compile=inductor"),
    ({"compile": "xla"}, "compile=xla needs framework=jax"),
    ({"compile": "inductor", "framework": "numpy"}, "compile=inductor needs framework=torch"),
    ({"cc_flags": "O3"}, "cc_flags=O3 needs compile=inductor"),
    ({"lora_rank": 4}, "lora_rank needs task=finetune_lora"),
    ({"lora_rank": 4, "task": "finetune"}, "lora_rank needs task=finetune_lora"),
    ({"attention": "sliding", "window": 128, "seq_len": 128}, "window >= seq_len"),
])
def test_constraint_violations_are_named(partial, reason):
    _, why = V.resolve(partial, cpu_count=2)
    assert any(reason in w for w in why)


def test_lora_rank_is_free_with_finetune_lora():
    assert V.resolve({"lora_rank": 4, "task": "finetune_lora"}, 2)[1] == []


@pytest.mark.parametrize("value", ["O2", "O3", "native", "native_fastmath", "lto"])
def test_cc_flags_is_free_with_inductor_and_off_its_default_joins_the_identity(value):
    config, why = V.resolve({"compile": "inductor", "cc_flags": value}, 2)
    assert why == []
    default, _ = V.resolve({"compile": "inductor"}, 2)
    assert "cc_flags" not in V.canonical_json(default)  # a later release's variable at its default
    assert V.config_hash(config) != V.config_hash(default)


def test_explicit_head_dim_lifts_the_divisibility_constraint():
    config, why = V.resolve({"d_model": 100, "n_heads": 3, "head_dim": 32}, 2)
    assert why == [] and config["head_dim"] == 32


@pytest.mark.parametrize("partial, reason", [
    ({"framework": "jax", "attn_backend": "sdpa"}, "attn_backend=sdpa needs framework=torch"),
    ({"framework": "numpy", "onednn": True}, "onednn=on needs framework=torch"),
    ({"framework": "jax", "compile": "xla", "fusion": False}, "fusion=off needs framework=torch"),
    ({"framework": "numpy", "compile_cache": "warm"}, "compile_cache=warm needs framework=torch"),
    ({"framework": "numpy", "compile": "inductor"}, "compile=inductor needs framework=torch"),
    ({"framework": "torch", "compile": "xla"}, "compile=xla needs framework=jax"),
    ({"framework": "jax", "precision": "bitnet"}, "precision=bitnet needs framework=torch"),
    ({"framework": "numpy", "precision": "bf16"}, "precision=bf16 needs framework=torch or jax"),
    ({"framework": "numpy", "cc_flags": "O2"}, "cc_flags=O2 needs framework=torch"),
    ({"framework": "jax", "compile": "xla", "cc_flags": "native"}, "cc_flags=native needs framework=torch"),
])
def test_a_value_that_means_nothing_for_the_framework_is_a_violation(partial, reason):
    _, why = V.resolve(partial, 2)
    assert why == [reason]


@pytest.mark.parametrize("framework, compile_, expected", [
    ("jax", "eager", {"attn_backend": "manual", "onednn": False, "fusion": False, "compile_cache": "cold"}),
    ("jax", "xla", {"attn_backend": "manual", "onednn": False, "fusion": True, "compile_cache": "cold"}),
    ("numpy", "eager", {"attn_backend": "manual", "onednn": False, "fusion": False, "compile_cache": "cold"}),
])
def test_torch_only_variables_say_what_really_runs_on_other_frameworks(framework, compile_, expected):
    unset, why = V.resolve({"framework": framework, "compile": compile_}, 2)
    assert not why
    assert {k: unset[k] for k in expected} == expected
    explicit, why = V.resolve({"framework": framework, "compile": compile_, **expected}, 2)  # said out loud: fine
    assert not why and V.config_hash(explicit) == V.config_hash(unset)


def test_the_quick_presets_framework_axis_gives_one_job_per_framework():
    from orchestrator.queue import sweep

    plan = sweep.load(preset="quick", machine=sweep.Machine(cpu_count=2))
    by_framework: dict[str, int] = {}
    for job in plan.jobs:
        # the cost model's joint block runs JAX at 10x too
        if job["config"]["repeat"] == 0 and job["block"] != sweep.JOINT:
            by_framework[job["config"]["framework"]] = by_framework.get(job["config"]["framework"], 0) + 1
    assert by_framework["jax"] == by_framework["numpy"] == 1
    assert not [reason for reason in plan.rejected if "framework=" in reason]


@pytest.mark.parametrize("framework, runs", [("torch", "mkl_intel_path"), ("jax", "eigen"), ("numpy", "openblas")])
def test_blas_left_unset_is_the_library_the_framework_runs_and_keeps_old_hashes(framework, runs):
    config, why = V.resolve({"framework": framework}, 2)
    assert not why and config["blas"] == runs and config["compiler"] == "gcc"
    assert V.derived_words({"framework": framework})["blas"] == "auto"
    # torch's auto moved from mkl (what older jobs ran, and still hash as) to mkl_intel_path: a job of its own
    assert ('"blas"' in V.canonical_json(config)) == (framework == "torch")
    assert '"compiler"' not in V.canonical_json(config)


def test_blas_is_a_choice_of_the_numpy_trainer_only_and_joins_its_identity():
    chosen, why = V.resolve({"framework": "numpy", "blas": "blis"}, 2)
    assert not why and '"blas":"blis"' in V.canonical_json(chosen)
    assert V.config_hash(chosen) != V.config_hash(V.resolve({"framework": "numpy"}, 2)[0])
    assert V.resolve({"framework": "numpy", "blas": "eigen"}, 2)[1] == ["blas=eigen needs framework=jax"]
    assert V.resolve({"blas": "mkl"}, 2)[1] == []  # torch as shipped, spelled out: the jobs of older releases
    assert '"blas"' not in V.canonical_json(V.resolve({"blas": "mkl"}, 2)[0])


def test_compiler_needs_inductor_and_combines_with_cc_flags():
    config, why = V.resolve({"compile": "inductor", "compiler": "clang", "cc_flags": "O2"}, 2)
    assert not why and '"compiler":"clang"' in V.canonical_json(config)
    assert V.resolve({"compiler": "clang"}, 2)[1] == ["compiler=clang needs compile=inductor"]


def test_q4_is_refused_where_the_int4_kernel_cannot_take_the_linear_widths():
    assert V.resolve({"precision": "q4"}, 2)[1] == []
    assert V.resolve({"precision": "q4", "activation": "swiglu"}, 2)[1] == [
        "precision=q4 needs Linear outputs divisible by 16 and inputs by 32 (the int4 CPU kernel)"]


def test_a_stored_config_is_completed_with_the_values_its_variables_take_unset():
    for framework, runs in (("torch", "mkl"), ("numpy", "openblas")):
        config, _ = V.resolve({"framework": framework, "blas": runs}, 2)  # torch's auto ran mkl before release 6
        stored = json.loads(V.canonical_json(config))  # what jobs.config holds: blas, compiler left out
        assert "blas" not in stored and V.complete(stored) == config
        assert V.complete(stored)["blas"] == runs


def test_q8_enqueues_as_int8_while_an_old_databases_q8_job_keeps_its_own_identity():
    q8, why = V.resolve({"precision": "q8"}, 2)
    int8, _ = V.resolve({"precision": "int8"}, 2)
    assert not why and q8 == int8 and V.config_hash(q8) == V.config_hash(int8)  # one real int8 job
    old = dict(int8, precision="q8")  # what an older release stored: a simulated q8 run
    assert V.config_hash(old) != V.config_hash(int8)
    assert V.complete(json.loads(V.canonical_json(old)))["precision"] == "q8"


@pytest.mark.parametrize("partial, reason", [
    ({"cores": 2, "ranks": 3}, "ranks greater than cores"),
    ({"cores": 3, "ranks": 2}, "cores not divisible by ranks"),
    ({"cores": 2, "ranks": 2, "framework": "numpy"},
     "ranks>1 needs framework=torch (the NumPy trainer has no collective"),
    ({"cores": 2, "ranks": 2, "framework": "jax"}, "ranks>1 needs framework=torch (JAX's CPU data parallelism"),
    ({"cores": 2, "nodes": 2, "framework": "numpy"}, "nodes>1 needs framework=torch"),
    ({"cores": 2, "interconnect": "1gbit"}, "interconnect needs nodes>1"),
])
def test_ranks_that_cannot_run_are_refused_with_the_reason(partial, reason):
    _, why = V.resolve(partial, cpu_count=4)
    assert any(w.startswith(reason) for w in why), why


def test_threads_follow_a_ranks_slice_of_the_cores_and_ranks_one_keeps_old_hashes():
    config, why = V.resolve({"cores": 4, "ranks": 2}, cpu_count=4)
    assert not why
    assert config["omp_threads"] == config["intra_threads"] == config["inter_threads"] == 2
    one, _ = V.resolve({"cores": 4}, cpu_count=4)
    assert one["omp_threads"] == 4 and one["ranks"] == one["nodes"] == 1
    assert '"ranks"' not in V.canonical_json(one) and '"ranks":2' in V.canonical_json(config)


def test_interconnect_at_its_default_keeps_old_hashes_and_a_rate_is_a_job_of_its_own():
    two, why = V.resolve({"cores": 1, "nodes": 2}, cpu_count=2)
    shaped, why_shaped = V.resolve({"cores": 1, "nodes": 2, "interconnect": "1gbit"}, cpu_count=2)
    assert not why and not why_shaped
    assert '"interconnect"' not in V.canonical_json(two) and V.config_hash(two) != V.config_hash(shaped)
    with pytest.raises(BadInput, match="interconnect='1ms'"):
        V.BY_NAME["interconnect"].parse("1ms")
