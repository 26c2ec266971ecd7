"""Imports run one way, checked over every module with ast (imports inside functions included, so a
lazy import cannot hide an arrow the wrong way):

    bench.py  ->  worker/  ->  orchestrator/  ->  common/

and inside orchestrator/ by its jobs: stats/ (pure computation) imports only common/; queue/ imports
stats/ and common/; report/ and docs/ may import both. Inside the report, the data it shows imports no
words and no writer, the words no writer, neither writer the other, and no section a writer. No two
modules anywhere import each other, directly or round a longer cycle.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("common", "orchestrator", "worker")  # each may import only those before it (and itself)
PARTS = {"stats": set(), "queue": {"stats"}, "report": {"stats", "queue"}, "docs": {"stats", "queue"}}
STATS_NEVER = ("sqlalchemy", "matplotlib", "plotly", "rich", "typer")
REPORT = {"data": set(), "page_data": {"data"}, "words": {"data"}, "markdown": {"data", "words"},
          "html": {"data", "words", "page_data"}}
WRITERS = {"__init__", "markdown", "html"}
CORE = set(REPORT) | {"__init__"}
DRIVERS = {"watch"}  # report --watch: writes the report again as runs finish


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    paths = [ROOT / "bench.py"] + [p for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py"))]
    return {module_name(p): p for p in paths}


def imports_of(path: Path, modules) -> set[tuple[str, int]]:
    """(imported name, line) of every import in one file: the module where a `from X import m` names a
    module, else X; third-party names as written."""
    inside = path.is_relative_to(ROOT)
    package = ("" if not inside else module_name(path) if path.name == "__init__.py"
               else module_name(path).rpartition(".")[0])
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {(a.name, node.lineno) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                out.add((f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base, node.lineno))
    return out


def graph() -> dict[str, dict[str, int]]:
    """module -> project module it imports -> first line."""
    modules = all_modules()
    out = {}
    for name, path in modules.items():
        edges = {}
        for target, line in sorted(imports_of(path, modules)):
            if target in modules and target != name:
                edges.setdefault(target, line)
        out[name] = edges
    return out


def where(module: str, line: int) -> str:
    return f"{all_modules()[module].relative_to(ROOT)}:{line}"


def test_imports_between_packages_run_one_way():
    wrong = []
    for module, edges in graph().items():
        top = module.split(".")[0]
        if top not in LAYERS:
            continue
        allowed = set(LAYERS[:LAYERS.index(top) + 1])
        wrong += [f"{where(module, line)}: {top} imports {target}" for target, line in edges.items()
                  if target.split(".")[0] not in allowed]
    assert wrong == [], "imports against the layers:\n" + "\n".join(wrong)


def part(module: str) -> str | None:
    bits = module.split(".")
    return bits[1] if bits[0] == "orchestrator" and len(bits) > 1 and bits[1] in PARTS else None


def test_the_orchestrator_parts_import_one_way():
    wrong = []
    for module, edges in graph().items():
        mine = part(module)
        if mine is None:
            continue
        for target, line in edges.items():
            theirs = part(target)
            if target.startswith("orchestrator") and theirs != mine and theirs not in PARTS[mine]:
                wrong.append(f"{where(module, line)}: {mine}/ imports {target}")
    assert wrong == [], "imports against the orchestrator's parts:\n" + "\n".join(wrong)
    tops = {p.stem for p in (ROOT / "orchestrator").glob("*.py")} - {"__init__"}
    assert tops == set(), f"every module of orchestrator/ belongs to one of {sorted(PARTS)}: {sorted(tops)}"


def test_the_statistics_are_pure_computation():
    modules = all_modules()
    wrong = []
    for name, path in modules.items():
        if part(name) != "stats":
            continue
        for target, line in imports_of(path, modules):
            if target.split(".")[0] in STATS_NEVER:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} prints")
    assert wrong == [], "the statistics read no database, draw and print nothing:\n" + "\n".join(wrong)


def test_the_report_package_imports_run_one_way():
    wrong = []
    for module, edges in graph().items():
        if not module.startswith("orchestrator.report"):
            continue
        leaf = "__init__" if module == "orchestrator.report" else module.split(".")[2]
        for target, line in edges.items():
            if not target.startswith("orchestrator.report"):
                continue
            theirs = "__init__" if target == "orchestrator.report" else target.split(".")[2]
            if leaf in REPORT and theirs in CORE and theirs not in REPORT[leaf] | {leaf}:
                wrong.append(f"{where(module, line)}: {leaf} imports {theirs}")
            elif leaf not in CORE | DRIVERS and theirs in WRITERS:
                wrong.append(f"{where(module, line)}: {leaf} imports the writer {theirs}")
    assert wrong == [], "imports against the report's layers:\n" + "\n".join(wrong)


def cycles(edges: dict[str, dict]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_modules():
    assert cycles(graph()) == []


def test_the_cycle_finder_sees_a_long_cycle():
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]


def test_the_checker_sees_every_form_of_import(tmp_path):
    pkg = ROOT / "orchestrator" / "report"
    path = pkg / "html.py"
    found = {t for t, _ in imports_of(path, all_modules())}
    assert "orchestrator.report.words" in found and "orchestrator.stats.effects" in found
    lazy = tmp_path / "m.py"
    lazy.write_text("import os\n\ndef f():\n    from worker.machine.sensors import disturbance\n"
                    "    import orchestrator.queue.store\n    from orchestrator.report import html\n")
    assert imports_of(lazy, all_modules()) == {("os", 1), ("worker.machine.sensors", 4),
                                               ("orchestrator.queue.store", 5), ("orchestrator.report.html", 6)}


def test_common_is_a_package_that_owns_the_vocabulary():
    import common
    from common import datasets, errors, metrics, variables

    assert "imports neither" in common.__doc__
    assert variables.BY_NAME["dataset"].choices == (datasets.DATASET_HUB, datasets.DATASET_SHAKESPEARE,
                                                    datasets.DATASET_BUILTIN)
    assert issubclass(errors.BadInput, errors.BenchError)
    assert "step_ms_median" in metrics.METRICS and set(metrics.WORKER_METRICS) <= set(metrics.METRICS)
