from collections import Counter

import pytest

from common.errors import BadInput
from orchestrator.queue.sweep import PRESETS_DIR, Machine, load, preset_path, stretch_of

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

    def order(seed):
        return [j["config"]["d_model"] for j in load(write(tmp_path, text.format(seed)), machine=MACHINE).jobs]

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
    configs = [(j["block"], j["config"]["d_model"], j["config"]["n_layers"]) for j in load(path, machine=MACHINE).jobs]
    # each axis is a block holding its values and the base (once: an axis value equal to it is that job)
    assert sorted(configs) == sorted([("d_model", 32, 2), ("d_model", 64, 2), ("d_model", 128, 2),
                                      ("n_layers", 64, 2), ("n_layers", 64, 1)])


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


@pytest.mark.parametrize("preset", sorted(p.stem for p in PRESETS_DIR.glob("*.toml")))
def test_every_preset_expands(preset):
    plan = load(None, preset=preset, machine=Machine(cpu_count=2))
    assert plan.jobs, preset
    assert preset_path(preset).read_text().startswith("#")


# -- counted before expanded, expanded lazily ------------------------------------------------------

EIGHT_AXES = [f"--axis={name}={','.join(values)}" for name, values in (
    ("d_model", [str(32 + 8 * i) for i in range(10)]), ("n_layers", [str(i) for i in range(1, 11)]),
    ("seq_len", [str(32 + 8 * i) for i in range(10)]), ("batch_size", [str(i) for i in range(1, 11)]),
    ("steps", [str(i) for i in range(1, 11)]), ("seed", [str(i) for i in range(10)]),
    ("warmup_steps", [str(i) for i in range(10)]), ("dropout", [f"0.{i}" for i in range(10)]))]


def test_each_repeats_hash_is_the_catalogues_config_hash(tmp_path):
    from common.variables import canonical_json, config_hash

    plan = load(None, sets=["cores=1"], axes=["d_model=32,64", "omp_threads=auto,1"], repeats=3, machine=MACHINE)
    for job in plan.jobs:
        assert job["config_hash"] == config_hash(job["config"])
        assert job["config_json"] == canonical_json(job["config"])
    assert len(plan.jobs) == 2 * 1 * 3  # omp_threads=auto is 1 on one core: two spellings of one job

def test_a_sweep_of_a_hundred_million_jobs_is_refused_with_its_count_and_nothing_written(db, tmp_path):
    from tests.conftest import bench

    proc = bench("enqueue", "--db", db, *EIGHT_AXES)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "100,000,000 jobs" in proc.stderr and "--max-jobs" in proc.stderr
    assert not (tmp_path / "results.db").exists()


def test_the_limit_is_the_users_to_raise_or_lower(tmp_path):
    axes = ["d_model=32,64,96", "n_layers=1,2"]
    assert load(None, axes=axes, repeats=2, machine=MACHINE, max_jobs=12).count == 12
    with pytest.raises(BadInput, match="plans 12 jobs .* more than the limit of 11"):
        load(None, axes=axes, repeats=2, machine=MACHINE, max_jobs=11)
    ofat = write(tmp_path, "[sweep]\nmode = \"ofat\"\n[axes]\nd_model = [32, 64]\nn_layers = [1, 2, 3]\n")
    assert load(ofat, machine=MACHINE).count == (2 + 1) + (3 + 1)  # each axis a block with its own baseline
    with pytest.raises(BadInput, match=r"plans 7 jobs \(ofat: d_model \(2\) \+ n_layers \(3\) values"):
        load(ofat, machine=MACHINE, max_jobs=6)


def test_a_hundred_thousand_jobs_are_planned_in_bounded_memory(db):
    """The plan streams: a dry run of 100k jobs stays near the interpreter's own size (the list
    the old planner built took 175 MB for these)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    axes = EIGHT_AXES[:4] + ["--repeats", "10"]
    proc = subprocess.run([sys.executable, "-c", (
        "import resource, subprocess, sys; "
        f"r = subprocess.run([sys.executable, 'bench.py', 'enqueue', '--dry-run', '--db', {db!r}, *{axes!r}], "
        "check=True, capture_output=True, text=True); print(r.stdout, file=sys.stderr); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")],
        cwd=ROOT, capture_output=True, text=True, check=True)
    assert "would add 100000 new jobs" in proc.stderr
    assert int(proc.stdout) < 120_000, f"peak RSS {int(proc.stdout) // 1024} MB"


def test_each_ofat_block_runs_its_values_beside_its_own_baseline_in_a_new_order_every_pass(tmp_path):
    path = write(tmp_path, """
[sweep]
mode = "ofat"
repeats = 3
[base]
d_model = 64
[axes]
d_model = [32, 64, 128]
n_layers = [1, 4]
activation = ["relu", "silu"]
precision = { values = ["fp32", "bf16"], base = { d_model = 32 } }
""")
    plan = load(path, machine=MACHINE)
    jobs = plan.jobs  # in run order
    # each block: its values and its baseline, an axis value equal to the baseline being that job
    assert len(jobs) == 3 * (3 + 3 + 3 + 2) and plan.count == 3 * (4 + 3 + 3 + 3)
    passes = [[j for j in jobs if j["config"]["repeat"] == r] for r in range(3)]
    assert [j["config"]["repeat"] for j in jobs] == sorted(j["config"]["repeat"] for j in jobs)
    orders = []
    for jobs_of_pass in passes:
        blocks = [j["block"] for j in jobs_of_pass]
        runs_of = [b for i, b in enumerate(blocks) if i == 0 or blocks[i - 1] != b]
        assert sorted(runs_of) == sorted(set(blocks))  # each block's jobs are neighbours
        orders.append(runs_of)
    assert len({tuple(o) for o in orders}) > 1  # the blocks are shuffled anew in each pass
    # every block has its own baseline job (distinct identities), equal configs apart from the block
    base = {j["config_hash"] for j in passes[0] if j["config"]["d_model"] == 64 and j["config"]["n_layers"] == 2
            and j["config"]["activation"] == "gelu" and j["config"]["precision"] == "fp32"}
    assert len(base) == 3 and len({j["config_hash"] for j in jobs}) == len(jobs)
    # an axis table changes its own block's baseline only
    precision = sorted((j["config"]["precision"], j["config"]["d_model"])
                       for j in passes[0] if j["block"] == "precision")
    assert precision == [("bf16", 32), ("fp32", 32)]
    # planning twice gives the same jobs and order: re-enqueue is idempotent
    assert [j["config_hash"] for j in load(path, machine=MACHINE).jobs] == [j["config_hash"] for j in jobs]


def test_blocks_per_pass_runs_an_axis_block_that_many_times_a_pass_each_with_its_baseline(tmp_path):
    path = write(tmp_path, """
[sweep]
mode = "ofat"
repeats = 2
[axes]
cores = { values = "auto", blocks_per_pass = 3 }
n_layers = [1, 4]
""")
    plan = load(path, machine=MACHINE)
    jobs = plan.jobs
    assert plan.count == 2 * (3 * 3 + 3) and len(jobs) == 2 * (3 * 2 + 3)  # cores=2 is the baseline job
    for r in range(2):
        in_pass = [j for j in jobs if j["config"]["repeat"] == r]
        blocks = [j["block"] for j in in_pass]
        assert sorted(set(blocks)) == ["cores", "cores#2", "cores#3", "n_layers"]
        for block in ("cores", "cores#2", "cores#3"):  # each copy: cores 1 and its own baseline job
            assert sorted(j["config"]["cores"] for j in in_pass if j["block"] == block) == [1, 2]
        # the copies run as one stretch, shuffled together: 3 of each side by side
        stretches = [stretch_of(b) for b in blocks]
        assert [b for i, b in enumerate(stretches) if i == 0 or stretches[i - 1] != b] in (["cores", "n_layers"],
                                                                                          ["n_layers", "cores"])
        assert ([j["block"] for j in in_pass if stretch_of(j["block"]) == "cores"]
                != ["cores"] * 2 + ["cores#2"] * 2 + ["cores#3"] * 2)
    assert len({j["config_hash"] for j in jobs}) == len(jobs)  # every copy its own job: resumable
    with pytest.raises(BadInput, match="blocks_per_pass=0: expected a whole number"):
        load(write(tmp_path, "[sweep]\nmode = \"ofat\"\n[axes]\ncores = { values = [1, 2], blocks_per_pass = 0 }\n"),
             machine=MACHINE)
    with pytest.raises(BadInput, match="own `blocks_per_pass` needs sweep.mode"):
        load(write(tmp_path, "[axes]\ncores = { values = [1, 2], blocks_per_pass = 2 }\n"), machine=MACHINE)


def test_grid_jobs_keep_the_identity_they_had_before_blocks(tmp_path):
    from common import variables as V

    plan = load(write(tmp_path, "[axes]\nd_model = [32, 64]\n"), machine=MACHINE)
    for job in plan.jobs:
        assert job["block"] is None and job["config_hash"] == V.config_hash(job["config"])


def test_an_axis_base_needs_ofat_and_may_not_set_its_own_variable(tmp_path):
    with pytest.raises(BadInput, match="needs sweep.mode"):
        load(write(tmp_path, "[axes]\nprecision = { values = [\"fp32\"], base = { d_model = 32 } }\n"), machine=MACHINE)
    with pytest.raises(BadInput, match="may not set precision itself"):
        load(write(tmp_path, "[sweep]\nmode = \"ofat\"\n[axes]\n"
                             "precision = { values = [\"fp32\"], base = { precision = \"bf16\" } }\n"),
             machine=MACHINE)
