"""The presets: each states its question and its duration on 2 cores and on 16 in its header, and
together they cover the seed documents' ranges of every model and training variable."""

import re

import pytest

from common import variables as V
from orchestrator.queue.sweep import PRESETS_DIR, Machine, load

PRESETS = sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))
# The ranges (from the seed documents): every preset together must reach both ends.
SEED_RANGES = {"n_layers": (2, 32), "d_model": (128, 2048), "n_heads": (2, 32), "head_dim": (32, 128),
               "mlp_ratio": (2.0, 4.0), "dropout": (0.0, 0.2), "seq_len": (128, 2048), "window": (128, 512)}
BATCH_SWEEP = 5  # distinct batch sizes one preset must vary over, at least


def header(preset: str) -> str:
    lines = (PRESETS_DIR / f"{preset}.toml").read_text().splitlines()
    return "\n".join(line for line in lines[:next(i for i, l in enumerate(lines) if not l.startswith("#"))])


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_states_its_question_and_its_durations_on_2_and_16_cores(preset):
    text = header(preset)
    first = text.splitlines()[0]
    assert first.startswith(f"# {preset}: ") and "?" in first, first  # the question it answers
    duration = re.search(r"^# Duration\b[^:\n]*:(.*?)(?=^# [A-Z][a-z]+:|\Z)", text, re.M | re.S)
    assert duration, f"{preset}: no '# Duration:' paragraph"
    words = re.sub(r"\s*\n#\s*", " ", duration.group(1))  # one paragraph, however it is wrapped
    for cores in ("2 cores", "16 cores"):
        assert re.search(rf"{cores}[^.;]*?\d+(\.\d+)? (s|min|minutes|h|hours)\b", words, re.S), (preset, cores, words)
    assert re.search(r"measured|estimated", words), words


def jobs_of_every_preset() -> dict[str, list[dict]]:
    machine = Machine(cpu_count=16, freq_limits=None)
    return {name: [j["config"] for j in load(None, preset=name, machine=machine).iter_jobs()] for name in PRESETS}


def test_the_presets_together_cover_the_seed_ranges_a_batch_sweep_and_every_precision():
    jobs = jobs_of_every_preset()
    every = [c for configs in jobs.values() for c in configs]
    for name, (low, high) in SEED_RANGES.items():
        relevant = [c for c in every if name != "window" or c["attention"] != "full"]  # a window only matters off full
        values = {c[name] for c in relevant}
        assert low in values and high in values, (name, sorted(values))
    assert max(len({c["batch_size"] for c in configs}) for configs in jobs.values()) >= BATCH_SWEEP
    assert {c["precision"] for c in every} == set(V.BY_NAME["precision"].choices) - set(V.PRECISION_ALIASES)
