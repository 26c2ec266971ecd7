"""result/index.html opened in a real browser: Debian's headless Chromium driven by selenium, on
databases built through the real Store (tests/reportdb.py). The page must load without a console
error, hold every section and every varied variable, draw every plot, and its runs filter must work.

Selenium is pointed at /usr/bin/chromium and /usr/bin/chromedriver (Service with a path skips
Selenium Manager, so nothing is downloaded). Without them the browser tests skip, naming what is
missing; CI installs both (.ci/apt-packages.txt).
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest

from orchestrator.report import html as html_report
from orchestrator.report.html import SECTIONS, var_anchor
from orchestrator.report import write_report
from orchestrator.queue.store import Store
from tests.reportdb import configs, enqueue, machine_facts, metrics, run_all

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
BASE = {"d_model": 64, "n_layers": 1, "seq_len": 32, "precision": "fp32"}
OFAT = {"d_model": [32, 64, 128], "precision": ["fp32", "bf16", "int8"], "attn_backend": ["manual", "sdpa"],
        "governor": ["default", "performance"]}
GRID = {"n_layers": [1, 2], "seq_len": [32, 64]}  # varied together: an interaction plot


def law(c: dict) -> float:
    """A made-up machine: step time ~ d_model^1.5 n_layers seq_len^1.1, bf16 slower, manual attention slower."""
    t = 0.02 * c["d_model"] ** 1.5 * c["n_layers"] * (c["seq_len"] / 32) ** 1.1
    return t * (1.6 if c["precision"] == "bf16" else 1.0) * (1.2 if c["attn_backend"] == "manual" else 1.0)


def build(store: Store, machines: int = 1) -> dict:
    """Every machine runs the OFAT sweep and the 2x2 grid, 3 repeats: int8 fails, governor is skipped."""
    jobs = {}  # the base is in both lists: one job
    for c in configs(BASE, OFAT, repeats=3) + configs(BASE, GRID, repeats=3, grid=True):
        jobs[tuple(sorted(c.items()))] = c
    enqueue(store, list(jobs.values()))
    rng = random.Random(0)
    ids = []
    for k in range(machines):
        m = store.register_machine(machine_facts(f"host{k}", f"CPU {k}"))
        ids.append(m)

        def outcome(c, speed=1.0 + 0.5 * k):
            if c["precision"] == "int8":
                return "failed", "RuntimeError: int8 kernel missing on this CPU", {}
            if c["governor"] != "default":
                return "skipped", "governor: no cpufreq in this VM", {}
            return "done", None, metrics(law(c) * speed * math.exp(rng.gauss(0, 0.03)), c)
        run_all(store, m, outcome)
    return {"machines": ids, "jobs": len(jobs)}


def varied_variables(store: Store) -> set[str]:
    """Variables with more than one value among the claimed runs, straight from the database."""
    from sqlalchemy import text

    from common.variables import NAMES

    with store.transaction() as conn:
        return {n for n in NAMES if n != "repeat"
                and conn.execute(text(f'SELECT COUNT(DISTINCT "{n}") FROM v_results')).scalar() > 1}


@pytest.fixture
def browser():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        pytest.skip(f"no headless browser: {', '.join(missing)} missing (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1300,1000",
                "--allow-file-access-from-files"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_script_timeout(120)
    yield driver
    driver.quit()


def open_page(driver, path: Path) -> None:
    driver.get(path.resolve().as_uri())
    driver.execute_async_script("const done = arguments[arguments.length - 1];"
                                "window.cpubench.ready.then(() => done(true), e => done(String(e)));")
    driver.execute_script("window.cpubench.renderAll()")


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def runs_count(driver) -> tuple[int, int]:
    shown, total = re.match(r"([\d,]+) of ([\d,]+) runs", driver.find_element("id", "runs-count").text).groups()
    return int(shown.replace(",", "")), int(total.replace(",", ""))


def click(driver, element) -> None:
    """A real click, with the element scrolled clear of the sticky navigation bar."""
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def choose(driver, select_id: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", select_id)).select_by_value(value)


def test_the_page_works_offline_in_chromium_with_every_section_variable_and_plot(tmp_path, browser):
    store = Store(str(tmp_path / "results.db"))
    build(store)
    report = write_report(store, tmp_path / "result", plots=False)
    html = report.html_path.read_text()
    assert report.html_path == tmp_path / "result" / "index.html"
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", html), "the page must not load anything"
    assert html.count("plotly.js v") == 1, "plotly's JavaScript is inlined exactly once"

    open_page(browser, report.html_path)
    assert console_errors(browser) == []
    for section_id, _ in SECTIONS:
        assert browser.find_element("id", section_id).is_displayed(), section_id
    varied = varied_variables(store)
    assert {"d_model", "precision", "attn_backend", "governor", "n_layers", "seq_len"} <= varied
    for name in varied:
        assert browser.find_elements("id", var_anchor(name)), f"no section for varied variable {name}"
    # int8 only failed and governor=performance was only skipped: their sections say why.
    assert "int8 kernel missing" in browser.find_element("id", var_anchor("precision")).text
    assert "no cpufreq" in browser.find_element("id", var_anchor("governor")).text
    # Every plot was drawn (plotly puts an SVG in its div), the interaction plot included.
    plots = browser.find_elements("css selector", ".plot")
    assert plots and all(p.find_elements("css selector", ".main-svg") for p in plots)
    assert browser.find_elements("css selector", '.plot[data-plot="grid"] .main-svg')
    # A dot's hover text names its run, from the runs the page inflated.
    hover = browser.execute_script(
        "const d = document.querySelector('#var-d_model .plot'); return d.data[0].text[0];")
    assert hover.startswith("run ") and "ms" in hover and "tokens/s" in hover
    browser.save_screenshot(str(tmp_path / "report.png"))
    assert (tmp_path / "report.png").stat().st_size > 10_000
    assert console_errors(browser) == []


def test_the_runs_filter_sorts_and_filters_by_status_and_variable(tmp_path, browser):
    store = Store(str(tmp_path / "results.db"))
    build(store)
    report = write_report(store, tmp_path / "result", plots=False)
    counts = store.counts(None)
    open_page(browser, report.html_path)

    shown, total = runs_count(browser)
    assert shown == total == counts["done"] + counts["failed"] + counts["skipped"]
    choose(browser, "f-status", "failed")
    assert runs_count(browser) == (counts["failed"], total)
    statuses = {row.get_attribute("data-status")
                for row in browser.find_elements("css selector", "#runs-table tbody tr")}
    assert statuses == {"failed"}
    assert "int8 kernel missing" in browser.find_element("id", "runs-table").text

    choose(browser, "f-status", "")
    choose(browser, "f-variable", "d_model")
    rows = browser.find_elements("css selector", "#runs-table tbody td.config")
    assert rows and all("d_model=" in r.text for r in rows)
    assert runs_count(browser)[0] == 6  # d_model 32 and 128, 3 repeats each, all done

    # Sorting by step time puts the fastest first; a second click the slowest.
    choose(browser, "f-variable", "")
    header = browser.find_element("css selector", '#runs-table th[data-key="step_ms"]')
    click(browser, header)
    first = float(browser.find_element("css selector", "#runs-table tbody tr td:nth-child(6)").text)
    click(browser, header)
    last = float(browser.find_element("css selector", "#runs-table tbody tr td:nth-child(6)").text.replace(",", ""))
    assert first < last
    # A row of the effects table takes the reader to its variable.
    click(browser, browser.find_element("css selector", "table.effects tbody tr td:nth-child(3)"))
    assert browser.execute_script("return location.hash").startswith("#var-")
    browser.save_screenshot(str(tmp_path / "runs.png"))
    assert console_errors(browser) == []


def test_two_machines_get_their_own_sections_and_a_side_by_side_plot(tmp_path, browser):
    store = Store(str(tmp_path / "results.db"))
    ids = build(store, machines=2)["machines"]
    report = write_report(store, tmp_path / "result", plots=False)
    open_page(browser, report.html_path)
    assert console_errors(browser) == []
    for m in ids:
        assert browser.find_elements("id", var_anchor("d_model", m, several=True))
    text = browser.find_element("id", "machines").text
    assert "1.5" in text and "shared configurations" in text  # host1 runs at 1.5x host0's step time
    assert browser.find_elements("css selector", '.plot[data-plot="shared"] .main-svg')
    browser.save_screenshot(str(tmp_path / "two-machines.png"))


def test_an_empty_database_still_gives_a_page(tmp_path):
    store = Store(str(tmp_path / "results.db"))
    report = write_report(store, tmp_path / "result", plots=False)
    html = report.html_path.read_text()
    assert "No run has finished yet" in html
    assert all(f'id="{s}"' in html for s, _ in SECTIONS)


def test_compact_json_is_json_dumps_bytes_whichever_writes_them(monkeypatch):
    """compact_json: json.dumps' compact bytes, by msgspec where they are the same (a plain table) and by
    json.dumps where msgspec's would differ: texts past ASCII, DEL, floats it writes with or without an
    exponent unlike repr, a type it does not write."""
    rng = random.Random(7)
    plain = {"n": 3, "cols": {"run_id": [1, 2, 2**63 - 1], "step_ms": [0.0001, 12.5, None], "ok": [True, False, 0]},
             "dicts": {"status": ["done", 'say "hi"\\/', "a\nb\t\x00\x1f<&>"]},
             "xs": [rng.random() * 1e3 for _ in range(200)]}
    awkward = ["ünï €", "\u2028", "\x7f", 1e16, 1.5e300, 1e-05, 9.99e-05, -1e-07, 123456789012345678.0, (1, 2.5)]
    for value in [plain, *([x] for x in awkward), {"k": awkward}]:
        assert html_report.compact_json(value) == json.dumps(value, separators=(",", ":")).encode(), value
    dumped = []
    real = json.dumps
    monkeypatch.setattr(html_report.json, "dumps", lambda *a, **k: dumped.append(1) or real(*a, **k))
    assert html_report.compact_json(plain) == real(plain, separators=(",", ":")).encode() and not dumped
    assert html_report.compact_json([1e16]) == b"[1e+16]" and dumped
