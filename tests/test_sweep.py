from collections import Counter

import pytest

from orchestrator.errors import BadInput
from orchestrator.sweep import Machine, load, preset_path

MACHINE = Machine(cpu_count=2, freq_limits=(800, 2000))


def write(tmp_path, text, name="s.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_grid_expands_the_cartesian_product_times_repeats(tmp_path):
    path = write(tmp_path, """
[sweep]
name = "g"
repeats = 2
[base]
steps = 5
[axes]
n_layers = [1, 2, 4]
d_model = [32, 64]
""")
    plan = load(path, machine=MACHINE)
    assert len(plan.jobs) == 3 * 2 * 2
    assert {j["config"]["steps"] for j in plan.jobs} == {5}
    assert len({j["config_hash"] for j in plan.jobs}) == 12
    assert plan.varied == ["n_layers", "d_model"]


def test_every_repeat_zero_comes_before_any_repeat_one(tmp_path):
    path = write(tmp_path, "[sweep]\nrepeats = 3\n[axes]\nn_layers = [1, 2, 3, 4, 5]\n")
    repeats = [j["config"]["repeat"] for j in load(path, machine=MACHINE).jobs]
    assert repeats == sorted(repeats)


def test_run_order_is_a_seeded_shuffle(tmp_path):
    text = "[sweep]\nseed = {}\n[axes]\nd_model = [32, 40, 48, 56, 64, 72, 80, 88]\n"
    order = lambda seed: [j["config"]["d_model"] for j in load(write(tmp_path, text.format(seed)), machine=MACHINE).jobs]
    assert order(0) == order(0)
    assert order(0) != order(1)
    assert order(0) != sorted(order(0)) or order(1) != sorted(order(1))


def test_ofat_varies_one_factor_at_a_time_around_the_base(tmp_path):
    path = write(tmp_path, """
[sweep]
mode = "ofat"
[base]
d_model = 64
n_layers = 2
[axes]
d_model = [32, 64, 128]
n_layers = [1, 2]
""")
    configs = [(j["config"]["d_model"], j["config"]["n_layers"]) for j in load(path, machine=MACHINE).jobs]
    assert sorted(configs) == sorted([(64, 2), (32, 2), (128, 2), (64, 1)])


def test_random_mode_draws_samples_deterministically(tmp_path):
    text = "[sweep]\nmode = \"random\"\nsamples = 6\nseed = 3\n[axes]\nd_model = [32, 64, 128]\nn_layers = [1, 2, 3]\n"
    a = [j["config_hash"] for j in load(write(tmp_path, text), machine=MACHINE).jobs]
    b = [j["config_hash"] for j in load(write(tmp_path, text, "t.toml"), machine=MACHINE).jobs]
    assert a == b and 1 <= len(a) <= 6


def test_constraint_violations_are_rejected_and_counted_by_reason(tmp_path):
    path = write(tmp_path, "[sweep]\nrepeats = 2\n[axes]\nd_model = [64, 96]\nn_heads = [4, 5]\n")
    plan = load(path, machine=MACHINE)
    assert len(plan.jobs) == 2 * 2  # (64,4) and (96,4), two repeats each
    assert plan.rejected == Counter({"d_model not divisible by n_heads": 4})


def test_set_and_axis_override_the_file(tmp_path):
    path = write(tmp_path, "[base]\nsteps = 5\n[axes]\nd_model = [32]\n")
    plan = load(path, sets=["steps=7"], axes=["d_model=64,128"], machine=MACHINE)
    assert sorted(j["config"]["d_model"] for j in plan.jobs) == [64, 128]
    assert {j["config"]["steps"] for j in plan.jobs} == {7}


def test_machine_derived_axes(tmp_path):
    path = write(tmp_path, "[axes]\nfreq_mhz = \"auto:400\"\ncores = \"auto\"\n")
    plan = load(path, machine=Machine(cpu_count=6, freq_limits=(800, 2000)))
    assert sorted({j["config"]["freq_mhz"] for j in plan.jobs}) == [800, 1200, 1600, 2000]
    assert sorted({j["config"]["cores"] for j in plan.jobs}) == [1, 2, 4, 6]


def test_frequency_axis_on_a_machine_without_cpufreq_is_dropped_with_a_note(tmp_path):
    plan = load(write(tmp_path, "[axes]\nfreq_mhz = \"auto:400\"\n"), machine=Machine(cpu_count=2))
    assert any("no cpufreq" in n for n in plan.notes)


@pytest.mark.parametrize("text, message", [
    ("[axes]\nd_modle = [32]\n", "unknown variable 'd_modle' in axes.d_modle of"),
    ("[base]\nn_layers = \"two\"\n", "n_layers='two' in base.n_layers of"),
    ("[axes]\nn_layers = []\n", "axes.n_layers of .*: empty axis"),
    ("[axes]\nn_layers = 3\n", "axes.n_layers of .*: expected a list"),
    ("[sweep]\nmode = \"zigzag\"\n", "sweep.mode='zigzag'"),
    ("[sweep]\ncolour = 1\n", "unknown key sweep.colour"),
    ("[sweep\nname = 1", "not valid TOML"),
    ("[axes]\nprecision = [\"fp8\"]\n", "precision='fp8'"),
    ("[axes]\nn_layers = [0]\n", "n_layers=0 .* must be >= 1"),
    ("[extra]\nx = 1\n", "unknown table \\[extra\\]"),
    ("[base]\nrepeat = 2\n", "set by sweep.repeats"),
    ("[sweep]\nrepeats = \"many\"\n", "sweep.repeats='many'"),
])
def test_malformed_sweep_files_name_the_key_and_the_file(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(BadInput, match=message) as err:
        load(path, machine=MACHINE)
    assert "s.toml" in str(err.value) or "TOML" in str(err.value)


def test_a_missing_file_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="sweep file not found"):
        load(tmp_path / "nope.toml", machine=MACHINE)


@pytest.mark.parametrize("preset", ["quick", "model", "system", "full"])
def test_every_preset_expands(preset):
    plan = load(None, preset=preset, machine=Machine(cpu_count=2))
    assert plan.jobs, preset
    assert preset_path(preset).read_text().startswith("#")
