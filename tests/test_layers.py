"""Imports between the top-level packages run one way (DESIGN.md, Layout):

    bench.py  ->  worker/  ->  orchestrator/  ->  common/

common/ (the shared vocabulary: catalogue, metric list, dataset names, errors) imports neither;
orchestrator/ (plans, the store, the statistics, the reports) never imports worker/; worker/ (the
claim loop, the knobs, the probe, the trainers) uses the orchestrator's store. Every import is read
with ast, those inside functions included, so a lazy import cannot hide an arrow the wrong way.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("common", "orchestrator", "worker")  # each may import only those before it (and itself)
PROJECT = set(LAYERS) | {"bench", "tests", "benchmarks"}


def imported_packages(path: Path) -> set[tuple[str, int]]:
    """(top-level project package, line) of every absolute import in one file."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        out |= {(n.split(".")[0], node.lineno) for n in names if n.split(".")[0] in PROJECT}
    return out


def import_graph() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the places ("path:line") that import it."""
    graph: dict[str, dict[str, list[str]]] = {p: {} for p in LAYERS}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            for target, line in imported_packages(path):
                if target != package:
                    graph[package].setdefault(target, []).append(f"{path.relative_to(ROOT)}:{line}")
    return graph


def test_imports_between_packages_run_one_way():
    wrong = []
    for package, targets in import_graph().items():
        allowed = set(LAYERS[:LAYERS.index(package)])
        for target, places in targets.items():
            if target not in allowed:
                wrong += [f"{place}: {package} imports {target}" for place in places]
    assert wrong == [], "imports against the layers:\n" + "\n".join(wrong)


def test_common_is_a_package_that_owns_the_vocabulary():
    import common
    from common import datasets, errors, metrics, variables

    assert "imports neither" in common.__doc__
    assert variables.BY_NAME["dataset"].choices == (datasets.DATASET_HUB, datasets.DATASET_SHAKESPEARE, datasets.DATASET_BUILTIN)
    assert issubclass(errors.BadInput, errors.BenchError)
    assert "step_ms_median" in metrics.METRICS and set(metrics.WORKER_METRICS) <= set(metrics.METRICS)


def test_the_checker_sees_an_import_inside_a_function(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import os\n\ndef f():\n    from worker.sensors import disturbance\n    import orchestrator.store\n")
    assert imported_packages(path) == {("worker", 4), ("orchestrator", 5)}
