"""Random command lines over the whole CLI, and what every one of them must keep: the property test
(tests/test_cli_property.py, bounded) and its larger run (benchmarks/cli_property.py) share this.

A command line is drawn from bench.py's own commands and options (read from the click command, so a
new option is drawn without a change here), with values from pools of awkward ones: paths with
brackets and unicode, a non-UTF-8 file, a directory, missing files, another program's SQLite
database, an empty file, bad numbers, repeated and conflicting K=V. Each runs in process (typer's
CliRunner) in a fresh folder holding those files and a small cpubench database. What it must keep:

- the exit code is 0, 1 or 2, and no traceback reaches the terminal;
- an exit 1 or 2 says what is wrong in one line on stderr;
- an exit 2 leaves every file of the folder byte for byte (none created, changed or removed);
- `status`, `docs --check` and `enqueue --dry-run` leave every file as it was, whatever their exit.

Nothing trains: `work` only ever gets a --db that is not a usable cpubench database, `run` an unknown
preset, `once` a refused setting; `machine --remeasure`, `submit --slurm`, `report --watch` (it runs until interrupted)
and `docs` without --check (it writes the checkout's docs/) are not drawn.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st

LINE_TIMEOUT_S = 60
NOT_DRAWN = {("machine", "--remeasure"), ("submit", "--slurm"), ("docs", "--check"),  # --check: always given
             ("report", "--watch")}  # runs until interrupted, as `work --wait` would

# The folder every command line runs in (made by make_folder): name -> content (bytes), a directory
# (None), or "cpubench" (a copy of the template database).
FILES = {
    "good.toml": b'[sweep]\nname = "good"\n[base]\nd_model = 32\nsteps = 2\n[axes]\nn_layers = [1, 2]\n',
    "sweeps[old]/my.toml": b'[sweep]\nname = "width[test]"\n[base]\nd_model = 32\n',
    "\u00fcn\u00ef\u00e7\u00f8d\u00e9.toml": '[sweep]\nname = "\u00fcn\u00ef"\n[base]\nd_model = 32\n'.encode(),
    "latin1.toml": b"[sweep]\nname = '\xff\xfe'\n",
    "bad.toml": b"[sweep\nname = ",
    "axis.toml": b"[axis]\nd_model = [32]\n",
    "repeats.toml": b'[sweep]\nrepeats = "3"\n',
    "random.toml": b'[sweep]\nmode = "random"\nsamples = 20\n[axes]\nd_model = [32, 64, 128]\nn_layers = [1, 2, 3]\n',
    "rejected.toml": b"[base]\nd_model = 33\nn_heads = 2\n",
    "a folder": None,
    "empty.db": b"",
    "text.db": b"not a database\n",
    "results.db": "cpubench",
    "copy[1].db": "cpubench",
    "other.db": "other",
    "afile": b"x",
}
PATHS = ["good.toml", "sweeps[old]/my.toml", "\u00fcn\u00ef\u00e7\u00f8d\u00e9.toml", "latin1.toml", "bad.toml",
         "axis.toml", "repeats.toml", "random.toml", "rejected.toml", "a folder", "missing.toml", "[missing]/x.db",
         "empty.db", "text.db", "results.db", "copy[1].db", "other.db", "new.db", "new[2].db", "afile",
         "afile/inside", "", "foo://x", "mysql://u@h/db", "sqlite:///new-url.db", "out[dir]"]
NOT_CPUBENCH = ["missing.db", "new[2].db", "empty.db", "text.db", "other.db", "a folder", "afile/inside",
                "[missing]/x.db", "foo://x", ""]
GOOD = 3  # a good value is drawn this many times as often as each awkward one: success paths get exercised
DBS = (["results.db"] * GOOD + ["copy[1].db", "new.db", "new[2].db"] + NOT_CPUBENCH
       + ["good.toml", "sqlite:///new-url.db"])
SWEEPS = ["good.toml"] * GOOD + ["sweeps[old]/my.toml", "\u00fcn\u00ef\u00e7\u00f8d\u00e9.toml"] * 2 + PATHS
SOURCES = ["copy[1].db"] * GOOD + PATHS  # merge's other databases
INTS = ["1", "2", "3"] * GOOD + ["0", "-1", "abc", "1e3", "99999999999999999999", "", " 4", "\u0663"]
FLOATS = ["0.5", "10", "600"] * GOOD + ["0", "-1", "nan", "inf", "abc", "1e309", ""]
TEXTS = ["quick", "model", "nosuch", "[bold]x[/]", "width[test]", "\u00fcn\u00ef", "", " ", "0-1", "0-999", "a,b",
         "x" * 120, "rack", "-"]
PRESETS = ["quick", "model"] * GOOD + ["nosuch", "[red]x", ""]
GOOD_SETS = ["d_model=32", "d_model=64", "n_layers=1", "steps=2", "cores=auto", "d_model=32,64", "n_heads=2",
             "n_layers=1,2"]
BAD_SETS = ["d_model=33", "d_model=x", "nosuch=1", "=3", "d_model", "d_model=64,,128", "d_model=",
            "precision=fp8", "freq_mhz=auto:400", "seq_len=[32]", "\u00fcn\u00ef=1", "repeat=1", "cores=auto:2",
            "d_model=1e999", "mlp_ratio=nan", "steps=-1"]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(folder: Path) -> dict[str, str]:
    """Every file and folder under `folder`: its hash, or "dir"."""
    return {str(p.relative_to(folder)): ("dir" if p.is_dir() else sha(p)) for p in sorted(folder.rglob("*"))}


def make_template(path: Path) -> None:
    """A small cpubench database: two sweeps (one named with brackets), queued jobs, no runs."""
    from typer.testing import CliRunner

    from bench import app

    for args in (["--set", "d_model=32", "--axis", "n_layers=1,2", "--name", "w[x]"], ["--set", "d_model=64"]):
        result = CliRunner().invoke(app, ["enqueue", "--db", str(path), *args])
        assert result.exit_code == 0, result.output


def make_folder(folder: Path, template: Path) -> None:
    for name, content in FILES.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is None:
            path.mkdir()
        elif content == "cpubench":
            shutil.copyfile(template, path)
        elif content == "other":
            with sqlite3.connect(path) as conn:
                conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
                conn.execute("INSERT INTO notes (text) VALUES ('mine')")
            conn.close()
        else:
            path.write_bytes(content)


def _kind(param) -> str:
    """What values an option takes, from its help record's metavar (`<int>`, `<float>`, `<path>`...)."""
    name = param.name
    if name == "db":
        return "db"
    if name in ("out_dir", "logs"):
        return "path"
    if name in ("set_", "axis", "settings"):
        return "assignment"
    if name == "preset":
        return "preset"
    if getattr(param, "is_flag", False):
        return "flag"
    kind = str(getattr(param, "type_descriptor", "") or "").lower()
    metavar = (param.metavar or "").lower()
    record = f"{kind} {metavar}"
    if "int" in record:
        return "int"
    if "float" in record:
        return "float"
    return "text"


@st.composite
def command_line(draw, cli) -> list[str]:
    """One command line over `cli` (bench.py's click group)."""
    name = draw(st.sampled_from(sorted(cli.commands)))
    cmd = cli.commands[name]
    args: list[str] = [name]
    for param in cmd.params:
        opts = [o for o in param.opts if o.startswith("-")]
        if opts and (name, opts[0]) in NOT_DRAWN:
            continue
        kind = _kind(param)
        if not opts:  # a positional argument
            if param.name == "sweep_file":
                if draw(st.booleans()):
                    args.append(draw(st.sampled_from(SWEEPS)))
            elif param.name == "others":
                args += draw(st.lists(st.sampled_from(SOURCES), min_size=0, max_size=2))
            elif param.name == "settings":
                args += draw(st.lists(st.sampled_from(GOOD_SETS + BAD_SETS), max_size=3))
            continue
        if draw(st.integers(0, 2)):  # each option in a third of the lines
            continue
        if kind == "flag":
            args.append(opts[0])
            continue
        times = draw(st.integers(1, 3)) if kind == "assignment" or draw(st.integers(0, 7)) == 0 else 1
        for _ in range(times):  # repeated options too
            pool = {"path": PATHS, "db": DBS, "assignment": GOOD_SETS * GOOD + BAD_SETS, "preset": PRESETS,
                    "int": INTS, "float": FLOATS, "text": TEXTS}[kind]
            if param.name == "max_jobs":  # raising the limit to 10^20 and asking for 10^20 jobs is a wish, granted
                pool = [v for v in pool if len(v) < 10]
            args += [opts[0], draw(st.sampled_from(pool))]
    # Nothing trains: each of these gets one input it must refuse before any work starts.
    if name == "work":
        args = [a for a in _without(args, "--db")] + ["--db", draw(st.sampled_from(NOT_CPUBENCH))]
    elif name == "run":
        args = [a for a in _without(args, "--preset")] + ["--preset", draw(st.sampled_from(["nosuch", "[red]x", ""]))]
    elif name == "once":
        args.insert(draw(st.integers(1, len(args))), draw(st.sampled_from(BAD_SETS)))
    elif name == "docs":
        args.append("--check")
    return args


def _without(args: list[str], option: str) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == option:
            skip = True
            continue
        out.append(a)
    return out


@dataclass
class Tally:
    """What the command lines did: the figures the benchmark prints."""

    lines: int = 0
    by_exit: dict[int, int] = field(default_factory=dict)
    by_command: dict[str, int] = field(default_factory=dict)
    tracebacks: int = 0
    changed_on_exit_2: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, args, code, ok: bool, why: str = "") -> None:
        self.lines += 1
        self.by_exit[code] = self.by_exit.get(code, 0) + 1
        self.by_command[args[0]] = self.by_command.get(args[0], 0) + 1
        if not ok:
            self.failures.append(f"{args}: {why}")


def run_line(app, args: list[str], folder: Path, template: Path, tally: Tally | None = None) -> str | None:
    """Run one command line in a fresh `folder`; None when it kept every promise, else what it broke."""
    from typer.testing import CliRunner

    folder.mkdir()
    make_folder(folder, template)
    before = snapshot(folder)
    cwd = os.getcwd()
    os.chdir(folder)

    def too_long(*_):
        raise TimeoutError(f"still running after {LINE_TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(LINE_TIMEOUT_S)  # a line that would train or wait is a broken promise, not a hung test
    try:
        result = CliRunner().invoke(app, args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(cwd)
    after = snapshot(folder)
    code, out, err = result.exit_code, result.stdout, result.stderr
    broken = []
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        broken.append(f"raised {type(result.exception).__name__}: {result.exception}")
    if "Traceback" in out + err:
        broken.append("a traceback on the terminal")
    if tally is not None and broken:
        tally.tracebacks += 1
    if code not in (0, 1, 2):
        broken.append(f"exit {code}")
    if code in (1, 2) and len(err.strip().splitlines()) != 1:
        broken.append(f"exit {code} with {len(err.strip().splitlines())} lines on stderr: {err!r}")
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if code == 2 and changed:
        broken.append(f"exit 2 changed {changed}")
        if tally is not None:
            tally.changed_on_exit_2 += 1
    if (args[0] == "status" or (args[0] == "enqueue" and "--dry-run" in args) or args[0] == "docs") and changed:
        broken.append(f"{args[0]} (reads only) changed {changed}")
    shutil.rmtree(folder, ignore_errors=True)
    why = "; ".join(broken) or None
    if tally is not None:
        tally.add(args, code, why is None, why or "")
    if why:
        return f"{why}\n  stdout: {out[-400:]!r}\n  stderr: {err[-400:]!r}"
    return None
