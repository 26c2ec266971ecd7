"""The reference pages generated from the code agree with it: docs/variables.md and the catalogue."""

import subprocess
import sys

from common import variables as V
from orchestrator.docs import ROOT, stale_pages, variables_page


def test_docs_variables_md_is_what_the_catalogue_generates():
    assert stale_pages() == [], "docs/ is out of date with the catalogue: run `python bench.py docs`"


def test_the_variables_page_names_every_variable_with_its_default_and_values():
    page = variables_page()
    for var in V.CATALOGUE:
        row = next(line for line in page.splitlines() if line.startswith(f"| `{var.name}` |"))
        assert f"| {var.applied} |" in row
        for choice in var.choices:
            assert str(choice) in row, (var.name, choice)
    assert "finetune_lora" in page and "`lora_rank`" in page


def test_bench_docs_check_fails_on_a_stale_page_and_docs_rewrites_it(tmp_path):
    (tmp_path / "docs").mkdir()
    stale = tmp_path / "docs" / "variables.md"
    stale.write_text(variables_page().replace("| `task` |", "| `task_renamed` |"))
    assert stale_pages(tmp_path) == [stale]
    check = subprocess.run([sys.executable, str(ROOT / "bench.py"), "docs", "--check"], cwd=ROOT,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr  # the checkout's own page is current
    from orchestrator.docs import write_pages

    assert write_pages(tmp_path) == [stale]
    assert stale.read_text() == variables_page() and stale_pages(tmp_path) == []
