"""Sweep files (TOML) -> job configs. Pure: no I/O besides reading the file.

A sweep has a [sweep] table (name, mode grid|ofat|random|list, repeats, seed, samples), a [base] table
(values every job shares; the catalogue's defaults fill the rest) and an [axes] table (the varied
values); mode = "list" takes its combinations from [[configs]] entries (each a partial config over
[base], times the grid of any axes): configurations that differ in many variables at once, such as
the seed documents' reference runs. A [predict] table (`[predict.NAME]` partial configs) runs nothing:
the report predicts those configurations' times (predict_configs()). In mode = "ofat", [[configs]]
entries are *joint* configurations run beside the axes: a block of their own, `joint` (JOINT), that
holds them and the base, shuffled together in every pass like any block; they vary several sizes at
once (what a cost model needs to see interactions and GEMM shapes beyond the base) and belong to no
axis's comparison. Each combination is resolved and checked against the catalogue's constraints;
violations are counted by reason, never enqueued. Every repeat is its own job; all of repeat 0 runs first, so a
half-finished sweep already covers every combination.

An ofat axis may be a table, `precision = { values = [...], base = { d_model = 64 } }`: its block's
baseline is [base] with those changes (a variable whose slow values need a smaller model, or
lora_rank, which needs task = "finetune_lora"). `blocks_per_pass = K` in the table runs its block K
times in every pass (blocks `cores`, `cores#2`, ..., each with its own baseline job, run as one
stretch shuffled together): K times the runs for a comparison that needs them (cores, whose 2-thread
runs are the noisiest), at the cost of its own jobs only.

Inside a repeat pass the run order is blocked (mode ofat): a block is one comparison, an axis's
values plus the baseline, and its jobs run next to each other, shuffled inside the block; the blocks
are shuffled anew in every pass. On a shared machine noise is correlated in time, so neighbours
compare more precisely than runs minutes apart. The baseline is its own job in every block (the
block is part of a job's identity, `jobs.block`), so each comparison has its baseline beside it. In
grid, random and list modes a whole pass is one block (`jobs.block` NULL): a seeded shuffle.

Planning is lazy: the number of jobs is counted from the axes first, and a sweep above the limit
(DEFAULT_MAX_JOBS, raised with `enqueue --max-jobs` or BENCH_MAX_JOBS) is refused at once with its
count; below it the jobs are generated one at a time (`SweepPlan.iter_jobs`), so the store inserts
them in chunks and memory does not grow with the sweep (eight 10-value axes once took 10 GB).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from common import variables as V
from common.durations import parse_duration
from common.blocks import JOINT, stretch_of  # the sweep's vocabulary
from common.errors import BadInput

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
MODES = ("grid", "ofat", "random", "list")
SWEEP_KEYS = {"name": str, "mode": str, "repeats": int, "seed": int, "samples": int, "description": str,
              "budget": str}
TABLES = ("sweep", "base", "axes", "configs", "predict")
# The most jobs one sweep may plan unless the user says more: a million jobs is ~1 GB of database and
# months of machine time; a bigger count is almost always a stray axis.
DEFAULT_MAX_JOBS = 1_000_000
# Never a repeat index: marks where the repeat goes in a config's canonical JSON.
_REPEAT_MARK = -987_654_321


@dataclass
class Machine:
    """What expansion needs to know of the machine: CPU count, and frequency limits if any.
    The limits may be given as a function, called only when a sweep asks for "auto:" frequencies."""

    cpu_count: int
    freq_limits: tuple[int, int] | None | Callable[[], tuple[int, int] | None] = None

    @property
    def freq_limits_mhz(self) -> tuple[int, int] | None:
        if callable(self.freq_limits):
            self.freq_limits = self.freq_limits()
        return self.freq_limits


@dataclass
class SweepPlan:
    name: str
    source: str
    text: str  # what was expanded: the file text plus the command-line overrides
    mode: str
    count: int  # jobs planned before constraints: combinations times repeats (the limit's measure)
    rejected: Counter = field(default_factory=Counter)  # reason -> jobs, complete after iter_jobs()
    notes: list[str] = field(default_factory=list)
    varied: list[str] = field(default_factory=list)
    combinations: Callable[[], Iterator[dict]] = lambda: iter(())
    repeats: int = 1
    seed: int = 0
    cpu_count: int = 1
    blocks: list[str] = field(default_factory=list)  # ofat: the blocks (axes) in plan order; else empty
    budget_s: float | None = None  # sweep.budget: what `run` spends on it by default (orchestrator/queue/budget.py)
    _jobs: list[dict] | None = None

    def iter_jobs(self) -> Iterator[dict]:
        """The jobs one at a time, in expansion order: each a dict of config, config_hash, run_order,
        block, derived and config_json (the canonical JSON of the config). Counts rejections as it goes."""
        self.rejected.clear()
        seen = set()
        orders = block_orders(self.seed, self.repeats, self.blocks)
        for block, combo in self.combinations():
            config, why = V.resolve(combo, self.cpu_count)
            if why:
                self.rejected[why[0]] += self.repeats
                continue
            head, tail = V.canonical_json(dict(config, repeat=_REPEAT_MARK)).split(f'"repeat":{_REPEAT_MARK}')
            identity = None
            derived = V.derived_words(combo)  # kept with the job: which values followed others
            for r in range(self.repeats):
                canonical = f'{head}"repeat":{r}{tail}'
                config_hash = hashlib.sha256(V.identity_text(canonical, block).encode()).hexdigest()
                if identity is None:  # repeat 0: the combination's identity
                    identity = config_hash
                    key = int(identity[:16], 16)
                    if key in seen:
                        break  # two spellings of one run in one block (an axis value equal to the base, say)
                    seen.add(key)
                order = run_order(self.seed, r, identity) if block is None else \
                    block_run_order(self.seed, r, orders[r][stretch_of(block)], identity)
                yield {"config": dict(config, repeat=r), "config_hash": config_hash, "config_json": canonical,
                       "run_order": order, "block": block, "derived": derived}

    @property
    def jobs(self) -> list[dict]:
        """Every job, in run order (small sweeps and tests; enqueue streams iter_jobs())."""
        if self._jobs is None:
            self._jobs = sorted(self.iter_jobs(), key=lambda j: j["run_order"])
        return self._jobs


def predict_configs(doc: dict, where: str) -> dict[str, dict]:
    """The [predict] table of a sweep: `[predict.NAME]` sub-tables, each a partial config over the
    catalogue's defaults, whose step and training times the report predicts ("How long would it take
    here", orchestrator/report/sections/prediction.py) though no job runs them."""
    table = doc.get("predict", {})
    if not isinstance(table, dict):
        raise BadInput(f"predict in {where}: expected a table [predict] of [predict.NAME] tables")
    out = {}
    for name, entry in table.items():
        if not isinstance(entry, dict):
            raise BadInput(f"predict.{name} in {where}: expected a table [predict.{name}] of variable = value")
        parsed = {}
        for key, value in entry.items():
            _check_settable(key, f"predict.{name}.{key}", where)
            parsed[key] = V.parse_value(key, value, f"predict.{name}.{key} of {where}")
        out[name] = parsed
    return out


def preset_path(name: str) -> Path:
    path = PRESETS_DIR / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PRESETS_DIR.glob("*.toml")))
        raise BadInput(f"unknown preset {name!r}: known presets are {known}")
    return path


def read_sweep_file(path: Path) -> tuple[dict, str]:
    """The parsed TOML and its text; a missing file or bad TOML is BadInput naming the file."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"sweep file not found: {path}") from None
    except IsADirectoryError:
        raise BadInput(f"sweep file {path} is a directory, not a TOML file") from None
    except UnicodeDecodeError as err:
        raise BadInput(f"sweep file {path} is not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
                       f"{err.start}): TOML files are UTF-8") from None
    except OSError as err:
        raise BadInput(f"cannot read sweep file {path}: {err.strerror}") from None
    try:
        return tomllib.loads(raw), raw
    except tomllib.TOMLDecodeError as err:
        raise BadInput(f"{path}: not valid TOML: {err}") from None


def parse_assignment(item: str, option: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise BadInput(f"{option} {item!r}: expected K=V")
    return key.strip(), value.strip()


def load(path: Path | None = None, *, preset: str | None = None, sets: list[str] = (), axes: list[str] = (),
         repeats: int | None = None, machine: Machine, max_jobs: int | None = None,
         name: str | None = None) -> SweepPlan:
    """Read a sweep file or preset, apply --set / --axis / --repeats / --name overrides, plan it
    (lazily; more than max_jobs jobs, DEFAULT_MAX_JOBS unless given, is refused with the count). A
    sweep from the command line alone is named after its axes and settings unless `name` is given."""
    if path is not None and preset is not None:
        raise BadInput("give a sweep file or --preset, not both")
    if preset is not None:
        path = preset_path(preset)
    if path is not None:
        doc, raw = read_sweep_file(path)
        where = str(path) if preset is None else f"preset {preset} ({path})"
        source = str(path) if preset is None else f"preset:{preset}"
    else:
        doc, raw, where, source = {}, "", "the command line", "command line"
    overrides = {"set": list(sets), "axis": list(axes), "repeats": repeats}
    doc = _with_overrides(doc, sets, axes, repeats, where)
    if name is not None:
        if not name.strip():
            raise BadInput("--name: give the sweep a name")
        doc.setdefault("sweep", {})["name"] = name
        overrides["name"] = name
    elif path is None:
        doc.setdefault("sweep", {})["name"] = command_line_name(sets, axes)
    text = raw if not any((sets, axes, repeats, name)) else f"{raw}\n# overrides: {json.dumps(overrides)}\n"
    return expand(doc, where=where, source=source, text=text, machine=machine, max_jobs=max_jobs)


def command_line_name(sets, axes) -> str:
    """The name of a sweep made on the command line: its axes (`d_model x n_layers`), else its
    settings (`set d_model=64`), so two different command-line sweeps are two rows of `status`."""
    varied = [parse_assignment(a, "--axis")[0] for a in axes]
    if varied:
        return " x ".join(varied)
    if sets:
        return "set " + " ".join(f"{k}={v}" for k, v in (parse_assignment(s, "--set") for s in sets))
    return "defaults"


def _with_overrides(doc: dict, sets, axes, repeats, where: str = "the sweep file") -> dict:
    """The document with the command line's values in. One variable is given once: a repeated --set
    or --axis, or --set and --axis of one variable, is refused (never resolved by their order)."""
    doc = {k: (dict(v) if isinstance(v, dict) else v) for k, v in doc.items()}
    base = doc.setdefault("base", {})
    if not isinstance(base, dict):
        return doc  # expand() reports it
    given: dict[str, str] = {}  # variable -> the option that gave it

    def once(key: str, option: str) -> None:
        if key in given:
            raise BadInput(f"{option}: {key} is already given by {given[key]}: give each variable once")
        given[key] = option

    for item in sets:
        key, value = parse_assignment(item, "--set")
        once(key, f"--set {item}")
        base[key] = value
    axes_table = doc.setdefault("axes", {})
    for item in axes:
        key, value = parse_assignment(item, "--axis")
        once(key, f"--axis {item}")
        values = [v.strip() for v in value.split(",")]
        if not any(values):
            raise BadInput(f"--axis {item!r}: no values")
        if not all(values):
            raise BadInput(f"--axis {item!r}: an empty value between commas")
        if len(values) == 1 and values[0].startswith("auto"):
            values = values[0]  # a machine-derived range, as in a sweep file: cores=auto, freq_mhz=auto:400
        if isinstance(axes_table, dict):
            axes_table[key] = values
    if isinstance(axes_table, dict):
        for item in sets:
            key = parse_assignment(item, "--set")[0]
            if key in axes_table:
                raise BadInput(f"--set {item}: {key} is an axis of {where}: replace the axis with --axis {key}=...")
    if repeats is not None:
        doc.setdefault("sweep", {})["repeats"] = repeats
    return doc


def expand(doc: dict, *, where: str, source: str, text: str, machine: Machine,
           max_jobs: int | None = None) -> SweepPlan:
    """A parsed sweep -> its plan. Raises BadInput naming the key and `where` for malformed input,
    and for more than max_jobs jobs (counted from the axes, before anything is generated)."""
    for key in doc:
        if key not in TABLES:
            raise BadInput(f"unknown table [{key}] in {where}: expected {', '.join(TABLES)}")
        if key == "configs":
            if not isinstance(doc[key], list) or not all(isinstance(c, dict) for c in doc[key]):
                raise BadInput(f"configs in {where}: expected an array of tables [[configs]]")
        elif not isinstance(doc[key], dict):
            raise BadInput(f"{key} in {where}: expected a table [{key}]")
    predict_configs(doc, where)  # checked here, run by no job: the report predicts them
    head = doc.get("sweep", {})
    for key, value in head.items():
        kind = SWEEP_KEYS.get(key)
        if kind is None:
            raise BadInput(f"unknown key sweep.{key} in {where}: expected {', '.join(SWEEP_KEYS)}")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise BadInput(f"sweep.{key}={value!r} in {where}: expected {kind.__name__}")
    name = head.get("name", "command-line" if source == "command line" else Path(source).stem)
    mode = head.get("mode", "grid")
    if mode not in MODES:
        raise BadInput(f"sweep.mode={mode!r} in {where}: expected one of {', '.join(MODES)}")
    repeats, seed = head.get("repeats", 1), head.get("seed", 0)
    budget_s = parse_duration(head["budget"], f"sweep.budget in {where}:") if "budget" in head else None
    if repeats < 1:
        raise BadInput(f"sweep.repeats={repeats} in {where}: must be >= 1")
    samples = head.get("samples")
    if mode == "random" and (samples is None or samples < 1):
        raise BadInput(f"sweep.samples in {where}: mode=random needs samples >= 1")
    if "name" in head and not str(head["name"]).strip():
        raise BadInput(f"sweep.name in {where}: give the sweep a name")

    base = {}
    for key, value in doc.get("base", {}).items():
        _check_settable(key, f"base.{key}", where)
        base[key] = V.parse_value(key, value, f"base.{key} of {where}")
    configs = []
    for i, entry in enumerate(doc.get("configs", [])):
        parsed = {}
        for key, value in entry.items():
            _check_settable(key, f"configs[{i}].{key}", where)
            parsed[key] = V.parse_value(key, value, f"configs[{i}].{key} of {where}")
        configs.append(parsed)
    if mode == "list" and not configs or configs and mode not in ("list", "ofat"):
        raise BadInput(f"{where}: [[configs]] entries go with sweep.mode = \"list\" (or \"ofat\", as joint "
                       f"configurations), and mode list needs at least one")
    notes: list[str] = []
    axes: dict[str, list] = {}
    block_bases: dict[str, dict] = {}  # ofat: an axis's own changes to [base] (its block's baseline)
    copies: dict[str, int] = {}  # ofat: an axis's blocks in each pass (blocks_per_pass), 1 unless said
    for key, values in doc.get("axes", {}).items():
        _check_settable(key, f"axes.{key}", where)
        if isinstance(values, dict):
            values, block_bases[key], copies[key] = _axis_table(key, values, mode, where)
        axes_values = _axis_values(key, values, where, machine, notes)
        if axes_values:
            axes[key] = axes_values

    if mode == "random" and samples > math.prod(len(v) for v in axes.values()):
        raise BadInput(f"sweep.samples={samples} in {where}: the axes have only "
                       f"{math.prod(len(v) for v in axes.values()):,} combinations, and random mode samples "
                       f"distinct ones: lower samples, or use mode = \"grid\" for all of them")
    count = _count(mode, axes, samples, copies) * (len(configs) if mode == "list" else 1) * repeats
    if mode == "ofat" and configs:
        count += (len(configs) + 1) * repeats
    limit = DEFAULT_MAX_JOBS if max_jobs is None else max_jobs
    if count > limit:
        sizes = " x ".join(f"{k} ({len(v)})" for k, v in axes.items()) or "no axes"
        shape = {"grid": sizes,
                 "ofat": (" + ".join(f"{k} ({len(v)})" for k, v in axes.items())
                          + " values, each axis with its baseline"),
                 "random": f"{samples} samples",
                 "list": f"{len(configs)} configs x {sizes}"}[mode]
        raise BadInput(f"{where}: this sweep plans {count:,} jobs ({mode}: {shape}, {repeats} repeat(s)), more than "
                       f"the limit of {limit:,}: narrow the axes, or raise the limit with --max-jobs N "
                       "(or BENCH_MAX_JOBS)")
    return SweepPlan(name=name, source=source, text=text, mode=mode, count=count, notes=notes,
                     varied=[k for k, vs in axes.items() if len(vs) > 1],
                     combinations=lambda: _combinations(mode, base, axes, seed, samples, configs, block_bases,
                                                        copies),
                     repeats=repeats, seed=seed, cpu_count=machine.cpu_count, budget_s=budget_s,
                     blocks=list(axes) + ([JOINT] if configs else []) if mode == "ofat" else [])


def block_names(axis: str, copies: int) -> list[str]:
    """The names of an ofat axis's blocks in one pass: the axis, then `axis#2`, `axis#3`, ... Each
    copy is its own set of jobs (jobs.block is part of a job's identity); they run as one stretch."""
    return [axis] + [f"{axis}#{i}" for i in range(2, copies + 1)]


def _count(mode: str, axes: dict[str, list], samples: int | None, copies: dict[str, int] | None = None) -> int:
    """Combinations the mode makes of these axes, without making them."""
    if mode in ("grid", "list"):
        return math.prod(len(v) for v in axes.values())
    if mode == "ofat":  # each axis a block (or blocks_per_pass of them): its values and its own baseline
        return sum((len(v) + 1) * (copies or {}).get(k, 1) for k, v in axes.items()) or 1
    return samples


def _check_settable(key: str, label: str, where: str) -> None:
    V.lookup(key, f"{label} of {where}")
    if key in V.SET_BY_SWEEP:
        raise BadInput(f"{label} in {where}: '{key}' is set by sweep.repeats, not by hand")


def _axis_table(key: str, table: dict, mode: str, where: str) -> tuple[object, dict, int]:
    """An ofat axis written as a table: `values`, `base`, the block's own changes to [base] (a
    variable that needs another baseline: a smaller model where a value is slow, task=finetune_lora
    for lora_rank), and `blocks_per_pass`, how many times its block runs in each pass. Its values and
    baseline still run side by side."""
    label = f"axes.{key} of {where}"
    unknown = sorted(set(table) - {"values", "base", "blocks_per_pass"})
    if unknown or "values" not in table:
        raise BadInput(f"{label}: a table axis has `values` and optionally `base` and `blocks_per_pass` "
                       f"(got {', '.join(sorted(table))})")
    for option in ("base", "blocks_per_pass"):
        if mode != "ofat" and option in table:
            raise BadInput(f"{label}: an axis's own `{option}` needs sweep.mode = \"ofat\" (each axis a block)")
    copies = table.get("blocks_per_pass", 1)
    if not isinstance(copies, int) or isinstance(copies, bool) or not 1 <= copies <= 100:
        raise BadInput(f"{label}: blocks_per_pass={copies!r}: expected a whole number from 1 to 100")
    own = table.get("base", {})
    if not isinstance(own, dict):
        raise BadInput(f"{label}: base must be a table of variable = value")
    parsed = {}
    for name, value in own.items():
        _check_settable(name, f"axes.{key}.base.{name}", where)
        if name == key:
            raise BadInput(f"{label}: its base may not set {key} itself: that is the axis")
        parsed[name] = V.parse_value(name, value, f"axes.{key}.base.{name} of {where}")
    return table["values"], parsed, copies


def _axis_values(key: str, values, where: str, machine: Machine, notes: list[str]) -> list:
    label = f"axes.{key} of {where}"
    if isinstance(values, str) and values.startswith("auto"):
        return _auto_axis(key, values, label, machine, notes)
    if not isinstance(values, list):
        raise BadInput(f"{label}: expected a list of values (or \"auto\"), got {values!r}")
    if not values:
        raise BadInput(f"{label}: empty axis")
    parsed = [V.parse_value(key, v, label) for v in values]
    return list(dict.fromkeys(parsed))  # duplicates add nothing


def _auto_axis(key: str, spec: str, label: str, machine: Machine, notes: list[str]) -> list:
    """Machine-derived ranges: cores (threads, ranks) = "auto" (1, 2, 4, ... all), freq_mhz = "auto:STEP"."""
    if key in ("cores", "omp_threads", "intra_threads", "ranks") and spec == "auto":
        n = machine.cpu_count
        return sorted({*(1 << i for i in range(n.bit_length()) if 1 << i <= n), n})
    if key == "freq_mhz":
        _, _, step_text = spec.partition(":")
        try:
            step = int(step_text)
        except ValueError:
            raise BadInput(f"{label}: expected \"auto:STEP\" with STEP in MHz, got {spec!r}") from None
        if step < 1:
            raise BadInput(f"{label}: STEP must be >= 1 MHz")
        if machine.freq_limits_mhz is None:
            notes.append(f"freq_mhz = {spec!r}: this machine reports no frequency limits (no cpufreq); axis dropped")
            return []
        low, high = machine.freq_limits_mhz
        values = list(range(low, high + 1, step))
        return values if values[-1] == high else [*values, high]
    raise BadInput(f"{label}: {spec!r} is not a machine-derived range for {key} "
                   f"(cores = \"auto\", freq_mhz = \"auto:STEP\")")


def _combinations(mode: str, base: dict, axes: dict[str, list], seed: int, samples: int | None,
                  configs: list[dict] = (), block_bases: dict[str, dict] | None = None,
                  copies: dict[str, int] | None = None) -> Iterator[tuple[str | None, dict]]:
    """The partial configs of the sweep, one at a time, each with its block: in ofat the axis it
    varies, or one of its block_names() (the base config once in every block, as that block's own
    job, with the axis's own changes to it if it has any); None in the other modes, where a whole
    repeat pass is one block."""
    if mode == "list":
        keys = list(axes)
        for entry in configs:
            for values in itertools.product(*axes.values()):
                yield None, {**base, **entry, **dict(zip(keys, values))}
    elif mode == "grid":
        keys = list(axes)
        for values in itertools.product(*axes.values()):
            yield None, {**base, **dict(zip(keys, values))}
    elif mode == "ofat":
        if not axes and not configs:
            yield None, dict(base)
        for key, values in axes.items():
            baseline = {**base, **(block_bases or {}).get(key, {})}
            for block in block_names(key, (copies or {}).get(key, 1)):
                yield block, baseline  # the block's baseline; an axis value equal to it is the same job
                for v in values:
                    yield block, {**baseline, key: v}
        if configs:  # the joint configurations, beside the base in a block of their own
            yield JOINT, dict(base)
            for entry in configs:
                yield JOINT, {**base, **entry}
    else:  # distinct combinations (expand() refuses more samples than there are); the draws of a
        # sweep without repeats are the ones the sampler always made
        rng = random.Random(seed)
        drawn = set()
        while len(drawn) < samples:
            combo = tuple(rng.choice(vs) for vs in axes.values())
            if combo not in drawn:
                drawn.add(combo)
                yield None, {**base, **dict(zip(axes, combo))}


def run_order(seed: int, repeat: int, identity: str) -> int:
    """Repeat in the high bits, a seeded hash below: all of repeat 0 first, each repeat shuffled anew."""
    digest = hashlib.sha256(f"{seed}:{repeat}:{identity}".encode()).hexdigest()
    return (repeat << 48) | int(digest[:12], 16)


# A blocked run order: repeat << 48 | block position << 32 | a seeded 32-bit hash inside the block.
BLOCK_BITS = 16


def block_positions(seed: int, repeat: int, blocks: list[str]) -> dict[str, int]:
    """Each block's position in repeat pass `repeat`: a seeded shuffle of the blocks, new in every
    pass, so a block's time of day (and what runs before it) changes between passes."""
    if len(blocks) >= 1 << BLOCK_BITS:
        raise BadInput(f"{len(blocks)} blocks: at most {(1 << BLOCK_BITS) - 1} axes in one ofat sweep")
    shuffled = sorted(blocks, key=lambda b: hashlib.sha256(f"{seed}:{repeat}:block:{b}".encode()).digest())
    return {b: i for i, b in enumerate(shuffled)}


def block_orders(seed: int, repeats: int, blocks: list[str]) -> list[dict[str, int]]:
    return [block_positions(seed, r, blocks) for r in range(repeats)]


def block_run_order(seed: int, repeat: int, position: int, identity: str) -> int:
    """Repeat in the high bits, then the block's shuffled position, then a seeded hash of the job:
    a pass runs block after block, each block's jobs (its values and its baseline) next to each other
    in a shuffled order, so a comparison is made between neighbours in time."""
    digest = hashlib.sha256(f"{seed}:{repeat}:{identity}".encode()).hexdigest()
    return (repeat << 48) | (position << 32) | int(digest[:8], 16)
