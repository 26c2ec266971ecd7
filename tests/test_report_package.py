"""The report package's parts depend one way (orchestrator/report/__init__.py):

    data.py  <-  words.py  <-  markdown.py, html.py  <-  __init__.py (write_report)

the data a report shows imports no words and no writer; the words import no writer; neither writer
imports the other. Every import is read with ast, those inside functions included, relative ones
too, so a lazy import cannot hide an arrow the wrong way. The modules that give the writers a
section of their own (seeds, pools, parallel runs, the cost model's predictions) sit below the
package and import nothing of it.
"""

import ast
from pathlib import Path

from orchestrator.report import html, write_report
from orchestrator.store import Store

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "orchestrator" / "report"
ALLOWED = {"data": set(), "words": {"data"}, "markdown": {"data", "words"}, "html": {"data", "words"}}
BELOW = ("seeds", "pool_report", "parallel_report", "learning_report", "learning", "prediction_report", "effects", "plots", "rows",
         "results_csv")


def package_imports(path: Path) -> set[tuple[str, int]]:
    """(module of orchestrator/report/ it imports, line): "__init__" for the package itself."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import html, from .words import x
                base = "orchestrator.report" + (f".{base}" if base else "")
            # `from orchestrator.report import html` imports a module; `import Report`, the package's face
            mods = [f"{base}.{a.name}" if base == "orchestrator.report" and (PACKAGE / f"{a.name}.py").exists()
                    else base for a in node.names]
        else:
            continue
        for mod in mods:
            if mod == "orchestrator.report" or (mod == "orchestrator" and isinstance(node, ast.ImportFrom)
                                                 and any(a.name == "report" for a in node.names)):
                out.add(("__init__", node.lineno))
            elif mod.startswith("orchestrator.report."):
                out.add((mod.split(".")[2], node.lineno))
    return out


def test_the_report_package_imports_run_one_way():
    wrong = []
    for module, allowed in ALLOWED.items():
        path = PACKAGE / f"{module}.py"
        wrong += [f"orchestrator/report/{module}.py:{line} imports {target}"
                  for target, line in sorted(package_imports(path)) if target not in allowed]
    for module in BELOW:
        path = ROOT / "orchestrator" / f"{module}.py"
        wrong += [f"orchestrator/{module}.py:{line} imports the report's {target}"
                  for target, line in sorted(package_imports(path))]
    assert wrong == [], "imports against the report's layers:\n" + "\n".join(wrong)
    assert set(ALLOWED) | {"__init__"} == {p.stem for p in PACKAGE.glob("*.py")}, "a new module needs its place here"


def test_the_checker_sees_every_form_of_import(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from orchestrator.report.data import Context\nfrom orchestrator.report import html\n"
                    "def f():\n    from . import markdown\n    from .words import short_reason\n"
                    "    import orchestrator.report.html\n    from orchestrator.report import Report\n"
                    "    from orchestrator import report\n")
    assert package_imports(path) == {("data", 1), ("html", 2), ("markdown", 4), ("words", 5), ("html", 6),
                                     ("__init__", 7), ("__init__", 8)}


def test_nothing_imports_the_old_modules():
    old = ("orchestrator.html_report", "import html_report", "orchestrator/report.py", "orchestrator/html_report.py")
    found = [f"{p.relative_to(ROOT)}: {o}" for d in ("orchestrator", "tests", "benchmarks", "docs")
             for p in sorted((ROOT / d).rglob("*")) if p.suffix in (".py", ".md") and p.name != Path(__file__).name
             for o in old if o in p.read_text()]
    found += [f"{p.name}: {o}" for p in (ROOT / "bench.py", ROOT / "README.md") for o in old if o in p.read_text()]
    assert found == []


def test_the_page_carries_its_css_and_javascript_files_as_they_are(tmp_path):
    report = write_report(Store(str(tmp_path / "results.db")), tmp_path / "result", plots=False)
    page = report.html_path.read_text(encoding="utf-8")
    css, js = ((html.STATIC / name).read_text(encoding="utf-8") for name in ("page.css", "page.js"))
    assert f"<style>\n{css}</style>" in page and f"<script>\n{js}</script>" in page
    assert "window.cpubench" in js and "@media print" in css


def test_a_report_leaves_the_garbage_collector_as_it_found_it_and_keeps_none_of_its_rows(tmp_path):
    """write_report freezes what exists (and the rows once read) so that its collections skip them: a
    long-lived caller (report --watch) must find every object collectable again afterwards."""
    import gc
    import weakref

    from tests.scaledb import build

    class Node:
        pass

    store = build(str(tmp_path / "r.db"), 300, machines=1, shape="small", quiet=True)
    cycle = Node()
    cycle.me = cycle  # garbage from before the report: only the cyclic collector frees it
    gone = weakref.ref(cycle)
    del cycle
    assert gc.isenabled() and gc.get_freeze_count() == 0
    write_report(store, tmp_path / "result", plots=True)  # the forked children too
    assert gc.isenabled() and gc.get_freeze_count() == 0, "the report left objects frozen"
    from orchestrator import config_index
    assert config_index._last[0] is None, "the report's rows outlive it (config_index's kept answer)"
    gc.collect()
    assert gone() is None, "the cycle made before the report was never collected after it"
