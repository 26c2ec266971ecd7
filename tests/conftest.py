"""Shared fixtures: an isolated worker state dir, a quick probe shared by the tests marked `probe`, a real
SQLite file, a real PostgreSQL server started for the session (Debian's postgresql), a way to run bench.py,
the CPU pressure that makes a wall-clock bound load-aware, and a test's orphans kept in its process tree."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pgserver import pg_bin, throwaway_postgres

ROOT = Path(__file__).resolve().parent.parent
# requirements.txt's
_NEEDED = ("sqlalchemy", "typer", "psutil", "numpy", "scipy", "torch", "jax", "hypothesis", "matplotlib")


def pytest_configure(config):
    """Run outside venv/ (a bare `pytest`), every test module would fail to import on its own: said once."""
    missing = [name for name in _NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        pytest.exit(f"{', '.join(missing)} not installed for {sys.executable}: run the tests with `make test` "
                    f"(it creates venv/ from requirements.txt and runs them there)", returncode=2)


@pytest.fixture(scope="session")
def probe_cache(tmp_path_factory) -> Path:
    """One quick probe for the session: its cache files seed the state dir of each test marked `probe`,
    so a test that starts a worker does not pay the probe's measurement child (a torch import) again."""
    from worker.machine.probe import probe

    state = tmp_path_factory.mktemp("probe")
    probe(state, quick=True)
    return state


_UNMARKED_PROBES = pytest.StashKey[list]()
# The markers whose tests get the session's probe cache: `probe`, and every marker of the full tier (their
# workers start as they did before the tiers, without a probe measurement of their own inside a timed
# scenario); a fast-tier test opts in with `probe`.
WITH_PROBE = ("probe", "trainer", "postgres", "slurm", "browser", "timing", "slow")


@pytest.fixture(autouse=True)
def isolated_state(request, tmp_path, monkeypatch):
    """Each test gets its own locks, journals and output dir, and the probe runs quick. Only a test marked
    `probe` (or one of the full tier's markers, WITH_PROBE) gets the session's probe cache, so a pure
    statistics test starts no child; an unmarked test that measured the probe anyway is named at the end of
    the session."""
    state = tmp_path / "state"
    marked = any(request.node.get_closest_marker(m) is not None for m in WITH_PROBE)
    if marked:
        shutil.copytree(request.getfixturevalue("probe_cache"), state)
    else:
        state.mkdir(parents=True)
    monkeypatch.setenv("BENCH_STATE_DIR", str(state))
    monkeypatch.setenv("BENCH_PROBE_QUICK", "1")
    # The queue's tests do not pay a torch child per CPU set for MFU's peak (recorded in each run's
    # applied.peak_gflops.basis); tests/test_gemm_peak.py measures per set.
    monkeypatch.setenv("BENCH_PEAK_PER_SET", "0")
    monkeypatch.setenv("BENCH_OUTPUT_DIR", str(tmp_path / "output"))
    monkeypatch.delenv("BENCH_DB", raising=False)
    monkeypatch.delenv("BENCH_CHILD_MODULE", raising=False)
    monkeypatch.delenv("BENCH_INTERCONNECT_LINKS", raising=False)  # only links a test hands over are shaped
    yield state
    if not marked and (state / "probe-limits.json").exists():
        request.config.stash.setdefault(_UNMARKED_PROBES, []).append(request.node.nodeid)


def pytest_terminal_summary(terminalreporter, config):
    unmarked = config.stash.get(_UNMARKED_PROBES, [])
    if unmarked:
        terminalreporter.write_sep("-", f"{len(unmarked)} test(s) measured the machine probe: mark them `probe` "
                                        "to share the session's")
        for nodeid in unmarked:
            terminalreporter.write_line(nodeid)


@pytest.fixture
def db(tmp_path) -> str:
    return str(tmp_path / "results.db")


def bench(*args: str, env: dict | None = None, timeout: float = 300,
          check: bool = False) -> subprocess.CompletedProcess:
    """Run `python bench.py ARGS` as a real process; returns the completed process."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench.py"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"bench {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def postgres_url():
    """A throwaway PostgreSQL server on loopback, for the session. Skipped only where Debian's
    postgresql is not installed (.ci/run installs it, so CI always runs these tests)."""
    if os.environ.get("BENCH_TEST_PG_URL"):
        yield os.environ["BENCH_TEST_PG_URL"]
        return
    if pg_bin() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    with throwaway_postgres() as url:
        yield url


@pytest.fixture
def pg_db(request, postgres_url):
    """A fresh database on the session's PostgreSQL server, for a test marked `postgres` (`make test` leaves
    those out)."""
    import psycopg

    if request.node.get_closest_marker("postgres") is None:
        pytest.fail(f"{request.node.nodeid} uses PostgreSQL: mark it `postgres`")

    name = f"t{time.time_ns()}"
    plain = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres_url.rsplit("/", 1)[0] + f"/{name}"


def cpu_stall_s() -> float | None:
    """Seconds since boot in which some runnable task waited for a CPU (/proc/pressure/cpu's `some` total);
    None on a kernel without pressure stall information."""
    try:
        with open("/proc/pressure/cpu") as f:
            some = f.readline()
        return int(some.rsplit("total=", 1)[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return None


class CpuStall:
    """The CPU stall since it was made: a wall-clock bound that holds on a quiet machine is checked against
    the time less the seconds in which some task waited for a CPU (any of those seconds the timed process
    may have spent waiting), so other processes on a busy machine cannot fail it. Without pressure stall
    information (an older kernel) the stall reads 0 and the bound is as strict as on a quiet machine."""

    def __init__(self) -> None:
        self.start = cpu_stall_s()

    def seconds(self) -> float:
        now = cpu_stall_s()
        return 0.0 if now is None or self.start is None else now - self.start


class Deadline:
    """A load-aware wall-clock bound: it has passed once `seconds` went by less the CPU stall meanwhile
    (CpuStall), or `stretch` times `seconds` in any case, so a busy machine stretches it and a hang still
    ends it."""

    def __init__(self, seconds: float, stretch: float = 10.0) -> None:
        self.seconds, self.stretch = seconds, stretch
        self.start, self.stall = time.monotonic(), CpuStall()

    def passed(self) -> bool:
        elapsed = time.monotonic() - self.start
        return elapsed - self.stall.seconds() >= self.seconds or elapsed >= self.stretch * self.seconds


def wait_until(predicate, timeout: float = 30.0, poll_s: float = 0.05) -> bool:
    """Whether predicate() held within `timeout` seconds, not counting those in which some task waited for a
    CPU (a Deadline: a busy machine stretches the wait, up to ten times)."""
    deadline = Deadline(timeout)
    while not deadline.passed():
        if predicate():
            return True
        time.sleep(poll_s)
    return False


PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37


def adopting_orphans() -> bool:
    """Whether this process adopts its orphaned descendants (the `adopts_orphans` fixture)."""
    flag = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    return bool(flag.value)


@pytest.fixture
def adopts_orphans():
    """For the test: a process whose parent dies (a training child of a killed worker) is adopted by this
    one (PR_SET_CHILD_SUBREAPER) instead of init, so it stays in the test's own process tree, where a test
    looks for what outlived a worker (tests/test_worker.py stub_children) without seeing other sessions'
    processes. Those adopted ended are reaped after it: job processes, each the leader of a group of its
    own (worker/spawn.py), which no Popen of the test waits for."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        import psutil

        for child in psutil.Process().children():
            try:
                if child.status() == psutil.STATUS_ZOMBIE and os.getpgid(child.pid) == child.pid:
                    os.waitpid(child.pid, os.WNOHANG)
            except (psutil.NoSuchProcess, ProcessLookupError, ChildProcessError):
                pass


def done_fields(**values) -> dict:
    """The fields of a done run as the store takes them: every metric named (None: not measured)."""
    from worker.trainers.harness import METRICS

    return dict.fromkeys(METRICS) | values
