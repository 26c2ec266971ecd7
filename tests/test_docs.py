"""The reference pages generated from the code agree with it: docs/variables.md and the catalogue."""

import subprocess
import sys

from common import variables as V
from orchestrator.docs.pages import ROOT, stale_pages, variables_page


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
    for page in ("v_results.md", "v_curves.md"):
        (tmp_path / "docs" / page).write_text((ROOT / "docs" / page).read_text())
    stale = tmp_path / "docs" / "variables.md"
    stale.write_text(variables_page().replace("| `task` |", "| `task_renamed` |"))
    assert stale_pages(tmp_path) == [stale]
    check = subprocess.run([sys.executable, str(ROOT / "bench.py"), "docs", "--check"], cwd=ROOT,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr  # the checkout's own page is current
    from orchestrator.docs.pages import write_pages

    assert write_pages(tmp_path) == [stale]
    assert stale.read_text() == variables_page() and stale_pages(tmp_path) == []


def _cli():
    import typer

    from bench import app

    return typer.main.get_command(app)


def test_docs_commands_md_is_what_the_command_line_generates_and_names_every_option():
    cli = _cli()
    assert stale_pages(cli=cli) == [], "docs/ is out of date with bench.py: run `python bench.py docs`"
    page = (ROOT / "docs" / "commands.md").read_text()
    for name, cmd in cli.commands.items():
        assert f"## {name}\n" in page
        for param in cmd.params:
            for opt in param.opts:
                if opt.startswith("--"):
                    assert f"`{opt}" in page.split(f"## {name}\n")[1].split("\n## ")[0], (name, opt)


def test_a_new_option_makes_commands_md_stale(tmp_path):
    from orchestrator.docs.commands import commands_page

    cli = _cli()
    (tmp_path / "docs").mkdir()
    for rel in ("docs/variables.md", "docs/v_results.md", "docs/v_curves.md", "docs/commands.md"):
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    assert stale_pages(tmp_path, cli) == []
    page = commands_page(cli)
    (tmp_path / "docs" / "commands.md").write_text(page.replace("| `--dry-run` |", "| `--dry-run-old` |"))
    assert stale_pages(tmp_path, cli) == [tmp_path / "docs" / "commands.md"]


def test_every_v_results_column_is_documented_from_schema_sql_and_the_page_is_current():
    from orchestrator.docs.schema import undocumented, v_results_page, view_columns

    assert undocumented() == []
    schema = (ROOT / "schema.sql").read_text()
    columns = [c.name for c in view_columns(schema)]
    page = v_results_page()
    assert all(f"| `{c}` |" in page for c in columns)
    for name in ("load_before", "gemm_format", "output_path", "claimed", "finished", "mem_total_gb", "sweep", "pool"):
        assert name in columns
    assert "GiB" in next(line for line in page.splitlines() if line.startswith("| `mem_total_gb` |"))
    # a column added to the view without a word in schema.sql fails
    drifted = schema.replace("r.setup_s,", "r.setup_s, r.heartbeat,", 1)
    assert undocumented(drifted) == ["heartbeat"]


def test_every_v_curves_column_is_documented_and_the_page_is_current():
    from orchestrator.docs.schema import undocumented, v_curves_page, view_columns

    assert undocumented(view="v_curves") == []
    columns = [c.name for c in view_columns(view="v_curves")]
    assert {"run_id", "attempt", "final", "step", "tokens", "time_s", "val_loss", "train_loss"} <= set(columns)
    assert (ROOT / "docs" / "v_curves.md").read_text() == v_curves_page()


def test_schema_calls_p_adjusted_what_effects_computes():
    schema = (ROOT / "schema.sql").read_text()
    assert "Holm" not in schema and "single-step Bonferroni" in schema
