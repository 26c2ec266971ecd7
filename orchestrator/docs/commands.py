"""docs/commands.md, generated from the command line itself: every command's usage, its docstring
and each option exactly as its `--help` gives it (the same click help records: name, value,
default, environment variable, range).

A command or option added to bench.py is in the reference after `python bench.py docs`; `bench.py
docs --check` and tests/test_docs.py fail while the page differs. Pure text over the click command
bench.py hands in (duck-typed: this module imports neither typer nor click, docs/layout.md).
"""

from __future__ import annotations

import inspect

GENERATED = ("<!-- generated from the command line (bench.py's options and docstrings) by `python bench.py docs`: "
             "edit bench.py, then run it -->")

INTRO = """\
# Commands

The reference for `bench.py`, generated from the command line itself (each section is what
`python bench.py COMMAND --help` prints); the [README](../README.md) has the quick start and
[sweep files](sweeps.md) the TOML format, presets and what enqueue refuses.

Every command that reads or writes the results database takes `--db URL` (a file path or an
SQLAlchemy URL such as `postgresql+psycopg://user@host/db`; default `results.db`; env `BENCH_DB`).

- Exit codes: 0 done, 1 a failure of the environment (a busy CPU, a database error, a full disk), 2 bad
  input: one line naming what is wrong and where, and no file created or changed (database, its
  -wal/-shm files, result folder).
- A command's result goes to stdout (`> log` keeps it); progress, notes and warnings go to stderr.
  With `--json` a command prints exactly one JSON document on stdout and nothing else there.
- Commands that only read (`status`, `report` apart from its folder) and `enqueue --dry-run` create
  and change no file. An option for one variable is given once: a repeated `--set`/`--axis`, or
  both for one variable, is refused.
- Text is printed as typed: a path or a sweep name with brackets keeps them.
"""

EXAMPLES = """\
## Examples

```
python bench.py enqueue --preset model
python bench.py enqueue --axis d_model=64,128,256 --axis n_layers=2,4 --set steps=30 --repeats 3 --name width-depth
python bench.py work
python bench.py status --json
python bench.py once d_model=256 n_layers=4 --json
python bench.py report --out result/
```
"""


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _first_sentence(text: str) -> str:
    flat = " ".join(text.split())
    end = flat.find(". ")
    return flat if end < 0 else flat[:end + 1]


def commands_page(cli, prog: str = "bench.py") -> str:
    """The page for a click group `cli` (bench.py's typer app as click sees it)."""
    root = cli.context_class(cli, info_name=prog)
    lines = [GENERATED, "", INTRO, "| command | does |", "|---|---|"]
    commands = list(cli.commands.items())
    for name, cmd in commands:
        lines.append(f"| [`{name}`](#{name}) | {_cell(_first_sentence(inspect.cleandoc(cmd.help or '')))} |")
    lines.append("")
    for name, cmd in commands:
        ctx = cmd.context_class(cmd, info_name=name, parent=root)
        usage = " ".join(cmd.collect_usage_pieces(ctx))
        lines += [f"## {name}", "", "```", f"python {prog} {name} {usage}".rstrip(), "```", "",
                  inspect.cleandoc(cmd.help or ""), ""]
        records = [p.get_help_record(ctx) for p in cmd.params]
        records = [r for r in records if r is not None]
        if records:
            lines += ["| argument or option | what |", "|---|---|"]
            lines += [f"| `{_cell(opts)}` | {_cell(what)} |" for opts, what in records]
            lines.append("")
    lines.append(EXAMPLES)
    return "\n".join(lines)
