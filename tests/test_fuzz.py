"""Property-based fuzzing of bad input through the real CLI (typer's runner, in process, so a few
hundred examples take seconds): sweep files, `--set`/`--axis` values and `once` settings. Bad input
never ends in a traceback: it exits 2 with a message, and nothing is written (the database file is
not created). A sweep too large to plan is refused at once, with its count."""

from __future__ import annotations

import math
import string
import uuid

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bench import app
from common import variables
from tests.conftest import bench

# the same examples every run, no .hypothesis/
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
NAMES = [v.name for v in variables.CATALOGUE if v.name not in variables.SET_BY_SWEEP]
# Characters a shell hands through: printable text, a few control and non-ASCII ones.
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)


def bad_value(var: variables.Variable) -> st.SearchStrategy[str]:
    """Values VAR refuses, by construction."""
    def refused(text: str) -> bool:
        try:
            var.parse(text)
        except variables.BadInput:
            return True
        return False

    options = [TEXT.filter(refused)]
    if var.type in (int, float):
        if var.min is not None:
            options.append(st.integers(max_value=math.floor(var.min) - 1).map(str))
        if var.max is not None:
            options.append(st.integers(min_value=math.ceil(var.max) + 1).map(str))
        options.append(st.sampled_from(["nan", "inf", "-inf", "1e999", "0x10", "1_000", "", " "]).filter(refused))
    return st.one_of(options)


def unknown_name() -> st.SearchStrategy[str]:
    return st.text(alphabet=string.ascii_letters + string.digits + "_-.", min_size=1, max_size=16).filter(
        lambda name: name not in variables.BY_NAME)


@st.composite
def bad_assignment(draw) -> str:
    """K=V that the catalogue refuses: an unknown name, a known one with a bad value, or no '='."""
    kind = draw(st.sampled_from(["unknown", "value", "no_equals", "set_by_sweep"]))
    if kind == "unknown":
        return f"{draw(unknown_name())}={draw(TEXT)}"
    if kind == "no_equals":
        return draw(TEXT.filter(lambda s: "=" not in s))
    if kind == "set_by_sweep":
        return f"{draw(st.sampled_from(variables.SET_BY_SWEEP))}=1"
    var = variables.BY_NAME[draw(st.sampled_from(NAMES))]
    return f"{var.name}={draw(bad_value(var))}"


@st.composite
def bad_axis(draw) -> str:
    """K=V1,V2 with at least one refused value (or an unknown name)."""
    if draw(st.booleans()):
        return f"{draw(unknown_name())}=1,2"
    var = variables.BY_NAME[draw(st.sampled_from(NAMES))]
    # an empty item between commas is skipped by the axis parser, not refused: keep items non-blank
    values = draw(st.lists(bad_value(var).filter(lambda v: "," not in v and v.strip()), min_size=1, max_size=3))
    if var.type is int and var.min is not None:
        values.insert(draw(st.integers(0, len(values))), str(int(max(var.min, 1))))  # a good one among them
    return f"{var.name}=" + ",".join(values)


def run_cli(*args: str):
    result = CliRunner().invoke(app, list(args))
    # CliRunner turns an uncaught exception into result.exception; typer.Exit becomes SystemExit
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.output, result.exception)
    assert "Traceback" not in result.output, (args, result.output)
    return result


class FreshDb:
    """A database path in an empty directory of its own, new for every example: after bad input
    the directory must still be empty (no database, no -wal/-shm/journal files)."""

    def __init__(self, root):
        self.root = root

    def __call__(self):
        folder = self.root / uuid.uuid4().hex
        folder.mkdir()
        return folder / "fuzz.db"


def nothing_written(db) -> bool:
    return not any(db.parent.iterdir())


@pytest.fixture
def fresh_db(tmp_path):
    return FreshDb(tmp_path)


@FUZZ
@given(sets=st.lists(bad_assignment(), min_size=1, max_size=3), good=st.booleans())
@example(sets=["mlp_ratio=nan"], good=False)
@example(sets=["d_model=1e999"], good=False)
@example(sets=["steps=-1"], good=False)
@example(sets=["=3"], good=False)
def test_bad_set_values_exit_2_and_write_nothing(fresh_db, sets, good):
    db = fresh_db()
    args = ["enqueue", "--db", str(db), *(("--set", "d_model=32") if good else ()),
            *[a for s in sets for a in ("--set", s)]]
    result = run_cli(*args)
    assert result.exit_code == 2, (args, result.output)
    assert "error" in result.output
    assert nothing_written(db)


@FUZZ
@given(axes=st.lists(bad_axis(), min_size=1, max_size=2))
@example(axes=["d_model="])
def test_bad_axis_values_exit_2_and_write_nothing(fresh_db, axes):
    db = fresh_db()
    args = ["enqueue", "--db", str(db), *[a for x in axes for a in ("--axis", x)]]
    result = run_cli(*args)
    assert result.exit_code == 2, (args, result.output)
    assert nothing_written(db)


TOML_VALUE = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), TEXT),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                          max_leaves=6)


def toml_text(table: dict) -> str:
    """A small TOML writer (tomllib only reads): good enough for fuzzed tables of scalars and lists."""
    import json

    def value(v):
        if v is None:
            return '"null"'
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float) and not math.isfinite(v):
            return {"nan": "nan", "inf": "inf", "-inf": "-inf"}[str(v)]
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"

    lines = []
    for section, body in table.items():
        lines.append(f"[{json.dumps(section)}]" if not section.isidentifier() else f"[{section}]")
        for key, v in body.items():
            lines.append(f"{json.dumps(key)} = {value(v)}")
    return "\n".join(lines) + "\n"


@st.composite
def bad_sweep(draw) -> str:
    """A sweep file that must be refused: not TOML, an unknown section or variable, a bad value,
    an empty axis, or a wrong type where a table or list belongs."""
    kind = draw(st.sampled_from(["garbage", "section", "variable", "value", "empty_axis", "shape", "mode"]))
    if kind == "garbage":
        return draw(st.text(min_size=1, max_size=80).filter(lambda s: "=" in s or "[" in s or '"' in s))
    var = variables.BY_NAME[draw(st.sampled_from(NAMES))]
    table = {"sweep": {"name": "fuzz"}, "base": {"d_model": 32}, "axes": {}}
    if kind == "section":
        table[draw(unknown_name().filter(lambda s: s not in ("sweep", "base", "axes")))] = {"x": draw(TOML_VALUE)}
    elif kind == "variable":
        table[draw(st.sampled_from(["base", "axes"]))][draw(unknown_name())] = draw(TOML_VALUE)
    elif kind == "value":
        table["axes"][var.name] = [draw(bad_value(var))]
    elif kind == "empty_axis":
        table["axes"][var.name] = []
    elif kind == "shape":
        table[draw(st.sampled_from(["sweep", "base", "axes"]))] = draw(
            st.one_of(st.integers(), TEXT, st.lists(st.integers(), max_size=2)))
    else:
        table["sweep"]["mode"] = draw(TEXT.filter(lambda s: s not in ("grid", "ofat", "random", "list")))
    if kind == "shape":
        section = next(k for k, v in table.items() if not isinstance(v, dict))
        rest = {k: v for k, v in table.items() if isinstance(v, dict)}
        import json

        value = table[section]
        literal = json.dumps(value) if not isinstance(value, list) else "[" + ", ".join(map(str, value)) + "]"
        return f"{section} = {literal}\n" + toml_text(rest)
    return toml_text(table)


@FUZZ
@given(text=bad_sweep())
@example(text="")
@example(text="[sweep]\nname = \"x\"\n[axes]\nd_model = \"32\"\n")
@example(text="\x00\xff[[[")
def test_bad_sweep_files_exit_2_and_write_nothing(tmp_path, fresh_db, text):
    db = fresh_db()
    sweep = tmp_path / f"{db.parent.name}.toml"
    sweep.write_text(text, encoding="utf-8", errors="surrogatepass")
    result = run_cli("enqueue", str(sweep), "--db", str(db))
    if result.exit_code == 0:
        # a few fuzzed files are valid after all (an empty one is a one-job sweep of the defaults):
        # that is fine, but then say so honestly; bad ones must be exit 2 and write nothing
        assert "added" in result.output
        return
    assert result.exit_code == 2, (text, result.output)
    assert nothing_written(db)


@FUZZ
@given(settings_=st.lists(bad_assignment(), min_size=1, max_size=3))
def test_bad_once_settings_exit_2_before_any_child(settings_):
    result = run_cli("once", *settings_)
    assert result.exit_code == 2, (settings_, result.output)


def test_too_large_sweep_refused_at_once_with_its_count(tmp_path):
    """Ten axes of ten values: 10^10 jobs, refused while counting (a planner that expanded them
    first would not return inside the test's timeout)."""
    db = tmp_path / "big.db"
    axes = [a for name in ("d_model", "n_layers", "n_heads", "seq_len", "batch_size", "grad_accum", "steps",
                           "warmup_steps", "seed", "window")
            for a in ("--axis", f"{name}=" + ",".join(str(8 + i) for i in range(10)))]
    proc = bench("enqueue", "--db", str(db), *axes, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not db.exists()
    assert "10,000,000,000 jobs" in proc.stderr, proc.stderr  # a grid (the default mode) of 10 x 10 values
