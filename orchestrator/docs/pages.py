"""The reference pages generated from the code: docs/variables.md from the variable catalogue,
docs/v_results.md from schema.sql's comments (orchestrator/docs/schema.py) and docs/commands.md from
the command line itself (orchestrator/docs/commands.py).

`python bench.py docs` rewrites them; `python bench.py docs --check` (and tests/test_docs.py) fails
when a page and the catalogue disagree, so adding a variable is one entry in the catalogue and one
command. Pure text: this module reads the catalogue and returns markdown; writing is `write_pages`.
"""

from __future__ import annotations

from pathlib import Path

from common.paths import REPO
from common import variables as V

ROOT = REPO
GENERATED = ("<!-- generated from the catalogue (common/variables.py) by `python bench.py docs`: "
             "edit the catalogue, then run it -->")
PLACES = {  # where a variable takes effect, in words
    V.KNOB: "knob: system state the worker sets before the child starts (sysfs, affinity, numactl)",
    V.ENV: "env: the child's environment (threads, allocator, ISA caps)",
    V.FRAMEWORK: "framework: switches inside the child (compile, attention kernels)",
    V.MODEL: "model: the architecture",
    V.TRAINING: "training: the training loop and data",
}


def _word(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _number(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def values_words(var: V.Variable) -> str:
    if var.choices:
        return ", ".join(_word(c) for c in var.choices)
    if var.type is bool:
        return "on/off"
    if var.min is not None or var.max is not None:
        span = f"{_number(var.min) if var.min is not None else ''}..{_number(var.max) if var.max is not None else ''}"
    else:
        span = {int: "an integer", float: "a number", str: "text"}[var.type]
    return span + (" or " + ", ".join(var.words) if var.words else "")


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def variables_page() -> str:
    """docs/variables.md: every variable of the catalogue, what follows what, and the per-framework rules."""
    lines = [GENERATED, "", "# Variables", "",
             "Every variable's name is the SQL column of `jobs` and `v_results`; a sweep file's `[base]` and `[axes]`,",
             "`--set K=V` and `--axis K=V1,V2` take these names and values ([commands](commands.md)). The order is",
             "the catalogue's: the order of the columns and of the reports.", "",
             "*applied* says where a variable takes effect:", ""]
    lines += [f"- {PLACES[p]}" for p in PLACES] + [""]
    lines += ["| variable | applied | default | values | what |", "|---|---|---|---|---|"]
    for var in V.CATALOGUE:
        lines.append(f"| `{var.name}` | {var.applied} | {_cell(_word(var.default))} | {_cell(values_words(var))} | "
                     f"{_cell(var.doc)} |")
    lines += ["", "## What follows what", "",
              f"A variable left on `{V.AUTO}` is derived from others when the job is made "
              "(`jobs.derived` records which),",
              "and the report compares a variable's values with its followers at their derived values:", ""]
    for d in V.DERIVATIONS:
        if d.name in V.TORCH_ONLY:
            continue
        lines.append(f"- `{d.name}` follows {', '.join(f'`{p}`' for p in d.parents)}")
    lines += [f"- {', '.join(f'`{n}`' for n in V.TORCH_ONLY)} follow `framework` (below)", "",
              "## Per framework", "",
              "A value that means nothing for the job's `framework` is a constraint violation at enqueue (counted",
              "with its reason), never a duplicate job nor a silent skip. What each framework can run, where it",
              "differs from the catalogue:", "",
              "| framework | "
              + " | ".join(sorted({n for r in V.FRAMEWORK_VALUES.values() for n in r}, key=V.NAMES.index))
              + " |"]
    names = sorted({n for r in V.FRAMEWORK_VALUES.values() for n in r}, key=V.NAMES.index)
    lines.append("|---|" + "---|" * len(names))
    for fw, rules in V.FRAMEWORK_VALUES.items():
        lines.append(f"| {fw} | " + " | ".join(", ".join(_word(x) for x in rules[n]) if n in rules else "any"
                                                for n in names) + " |")
    lines += ["", f"{', '.join(f'`{n}`' for n in V.TORCH_ONLY)} mean something only for torch. On the other",
              "frameworks the catalogue stores the value that describes what really runs there, so a row of",
              "`v_results` never claims a torch-only setting; leave them unset (or set exactly that value), any other",
              "value is refused (`attn_backend=sdpa needs framework=torch`):", ""]
    for fw in V.FRAMEWORK_VALUES:
        if fw == "torch":
            continue
        for compile_ in V.FRAMEWORK_VALUES[fw]["compile"]:
            there = V.elsewhere({"framework": fw, "compile": compile_})
            lines.append(f"- {fw}, compile={compile_}: " + ", ".join(f"{k}={_word(v)}" for k, v in there.items()))
    lines += ["", "Where the knobs, caps and precision modes come from: [ISA caps](isa.md),",
              "[precision modes](precision.md), [how a run is measured](method.md).", ""]
    return "\n".join(lines)


def _v_results_page() -> str:
    from orchestrator.docs.schema import v_results_page

    return v_results_page()


def _v_curves_page() -> str:
    from orchestrator.docs.schema import v_curves_page

    return v_curves_page()


PAGES = {"docs/variables.md": variables_page, "docs/v_results.md": _v_results_page, "docs/v_curves.md": _v_curves_page}
CLI_PAGE = "docs/commands.md"  # generated from the command line bench.py hands in (cli)


def _pages(cli=None) -> dict:
    if cli is None:
        return PAGES
    from orchestrator.docs.commands import commands_page

    return {**PAGES, CLI_PAGE: lambda: commands_page(cli)}


def stale_pages(root: Path = ROOT, cli=None) -> list[Path]:
    """The generated pages whose text differs from what the code generates now (docs/commands.md
    too when given the command line, `cli`: bench.py's click group)."""
    return [root / rel for rel, page in _pages(cli).items()
            if not (root / rel).exists() or (root / rel).read_text() != page()]


def write_pages(root: Path = ROOT, cli=None) -> list[Path]:
    """Rewrite every generated page; the ones whose text changed."""
    changed = stale_pages(root, cli)
    for rel, page in _pages(cli).items():
        (root / rel).write_text(page())
    return changed
