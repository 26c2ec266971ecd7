"""The seeds preset runs the source documents' reference configurations, and the report puts this
machine's figures beside the published ones (orchestrator/report/sections/seeds.py)."""

import pytest

from orchestrator.report import markdown as report_module
from orchestrator.report.sections import seeds
from common.errors import BadInput
from orchestrator.report import write_report
from orchestrator.queue.store import Store
from orchestrator.queue.sweep import Machine, load
from common.variables import resolve
from tests.reportdb import enqueue, machine_facts, metrics, run_all

MACHINE = Machine(cpu_count=2)


def test_the_seeds_preset_runs_each_published_reference_configuration_once():
    plan = load(None, preset="seeds", machine=MACHINE)
    assert not plan.rejected
    for ref in seeds.PUBLISHED:
        hits = [j for j in plan.jobs if seeds.matches(ref, j["config"])]
        assert len(hits) == 1, ref.id
    assert len(plan.jobs) == len(seeds.PUBLISHED)  # nothing in the preset that the table does not describe


def test_every_reference_configuration_is_valid_in_the_catalogue():
    for ref in seeds.PUBLISHED:
        config, why = resolve(ref.config, 2)
        assert not why, (ref.id, why)
        assert ref.kind in ("measured", "claimed", "estimated", "expected", "none")


def test_list_mode_takes_each_config_over_the_base_times_the_axes(tmp_path):
    path = tmp_path / "l.toml"
    path.write_text('[sweep]\nmode = "list"\n[base]\nsteps = 2\n[axes]\ncores = [1, 2]\n'
                    '[[configs]]\nd_model = 64\n[[configs]]\nd_model = 32\nsteps = 5\n')
    plan = load(path, machine=MACHINE)
    got = sorted((j["config"]["d_model"], j["config"]["steps"], j["config"]["cores"]) for j in plan.jobs)
    assert got == [(32, 5, 1), (32, 5, 2), (64, 2, 1), (64, 2, 2)]
    assert plan.count == 4


@pytest.mark.parametrize("text, message", [
    ('[sweep]\nmode = "grid"\n[[configs]]\nd_model = 64\n', 'mode = "list"'),
    ('[sweep]\nmode = "list"\n', "at least one"),
    ('[sweep]\nmode = "list"\n[[configs]]\nd_modle = 64\n', "configs[0].d_modle"),
    ('[sweep]\nmode = "list"\n[[configs]]\nd_model = "wide"\n', "configs[0].d_model"),
])
def test_a_malformed_list_sweep_names_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(BadInput, match=message.replace("[", r"\[").replace("]", r"\]")):
        load(path, machine=MACHINE)


def _seeds_db(store: Store, step_ms: dict[str, float], name: str = "here") -> int:
    m = store.register_machine(machine_facts(name, f"CPU {name}"))
    configs = []
    for ref in seeds.PUBLISHED:
        if ref.id in step_ms:
            for rep in range(2):
                config, why = resolve({**ref.config, "steps": 2, "warmup_steps": 1, "repeat": rep}, 8)
                assert not why
                configs.append(config)
    enqueue(store, configs, sweep="seeds")
    by_config = {ref.id: ref for ref in seeds.PUBLISHED}

    def outcome(c):
        ref = next(r for r in by_config.values() if seeds.matches(r, c))
        return "done", None, {**metrics(step_ms[ref.id], c), "mfu": 0.5}
    run_all(store, m, outcome)
    return m


def test_the_report_puts_this_machines_figures_beside_the_published_ones(tmp_path):
    store = Store(str(tmp_path / "results.db"))
    _seeds_db(store, {"R6": 2000.0, "R1": 8000.0, "R2a": 2000.0})
    text = write_report(store, tmp_path / "result", plots=False).summary_path.read_text()
    assert "## The seed documents' reference runs" in text
    table = text.split("## The seed documents' reference runs")[1]
    r6 = next(line for line in table.splitlines() if line.startswith("| R6 |"))
    cells = [c.strip() for c in r6.strip("|").split("|")]
    assert cells[3] == "2"  # two runs
    assert cells[4] == "2"  # s/step: 2000 ms
    assert cells[5] == "2.05e+03"  # 16 x 256 tokens in 2 s
    assert cells[6] == "0.5"
    assert "54-56 tokens/s" in r6 and "i5-1135G7" in r6 and cells[-1] == "measured"
    assert "| R4 |" in table and "not run" in table.split("| R4 |")[1].splitlines()[0]
    assert "data loader" in table  # R6's caveat
    assert "not say that one CPU is faster" in table
    # R2a's claim is checked against R1 on the same machine: 8 s over 2 s
    assert "here R1's step takes 4.00x R2a's" in table


def test_the_section_says_nothing_without_a_reference_run(tmp_path):
    store = Store(str(tmp_path / "results.db"))
    _seeds_db(store, {})
    assert seeds.seeds_lines([], {}) == []
    assert seeds.seeds_section in report_module.SECTIONS
