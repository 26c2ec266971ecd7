"""The report's pictures are drawn once each, laid out as fig.tight_layout() lays them out, by children
that import matplotlib before their pictures come (orchestrator/report/plots.py, report._import_plots)."""

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.report import plots
from orchestrator.report import write_report
from orchestrator.queue.store import Store
from tests.reportdb import configs, enqueue, machine_facts, metrics, run_all
from tests.test_report import sweep_db

ROOT = Path(__file__).resolve().parent.parent


def test_a_png_is_drawn_once_not_once_more_without_rendering(tmp_path):
    fig = plots.figure(4, 3)
    ax = fig.subplots()
    ax.plot([1, 10, 100], [3, 2, 1], "-o", label="a line")
    ax.set(xscale="log", title="a title", xlabel="x (units)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14))
    draws = []
    draw = fig.draw
    fig.draw = lambda renderer: (draws.append(renderer), draw(renderer))[1]

    plots._save(fig, tmp_path / "one.png")

    assert len(draws) == 1  # fig.tight_layout() left an engine behind: savefig drew it twice
    assert (tmp_path / "one.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_the_pngs_are_the_bytes_fig_tight_layout_gives(tmp_path, monkeypatch):
    store = Store(str(tmp_path / "results.db"))
    sweep_db(store)  # d_model (log axes, a fitted law) and precision (categories with ratio labels)
    m = store.register_machine(machine_facts("beta"))
    enqueue(store, configs({}, {"n_layers": [1, 2], "seq_len": [64, 128]}, repeats=2, grid=True))
    run_all(store, m, lambda c: ("done", None, metrics(c["n_layers"] * c["seq_len"] / 10, c)))

    new = write_report(store, tmp_path / "new")
    # The children are forked by write_report, after this: they draw with matplotlib's own call.
    monkeypatch.setattr(plots, "lay_out", lambda fig: fig.tight_layout())
    old = write_report(store, tmp_path / "old")

    names = sorted(p.name for p in new.plot_paths)
    assert names == sorted(p.name for p in old.plot_paths)
    assert any(n.startswith("grid_") for n in names) and "d_model.png" in names and "precision.png" in names
    drawn = sorted(p.name for p in (tmp_path / "new" / "plots").glob("*.png"))
    assert drawn == sorted(p.name for p in (tmp_path / "old" / "plots").glob("*.png"))
    for name in drawn:  # the cost model's predicted-vs-measured PNGs too, where its section drew them
        png_new, png_old = tmp_path / "new" / "plots" / name, tmp_path / "old" / "plots" / name
        assert png_new.read_bytes() == png_old.read_bytes(), name


def test_the_drawing_children_import_matplotlib_before_their_pictures_come():
    # A fresh interpreter: this one may have imported matplotlib already.
    code = ("import sys; from orchestrator.report import _import_plots; _import_plots(); "
            "print(all(m in sys.modules for m in ('matplotlib.figure', 'matplotlib.backends.backend_agg', "
            "'matplotlib.layout_engine', 'matplotlib.ticker')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
