"""Training text, its BPE tokenizer, the token ids and the batches, all cached under data/.

`prepare()` runs once per worker in the parent: it fetches the dataset through the `datasets`
library (or falls back to a built-in corpus this module generates) and writes it as plain text.
The child only calls `load_tokens()`, which reads that text file and never imports `datasets`
(pyarrow alone costs seconds of setup), and `Batches`; neither imports orchestrator/ or torch, so
every trainer (torch, JAX, NumPy) draws the same NumPy batches. A fork server calls `hold()` before
forking a child, so load_tokens() finds the ids in memory. Every file is written tmp + rename: two
workers may race.

Layout under data_dir:
    <slug>/corpus.txt          one row of text per line (newlines inside a row become spaces)
    <slug>/source.json         where the text came from, rows, characters, when
    <slug>/unreachable.json    the remembered "hub unreachable -> builtin" decision of the last prepare()
    <slug>/bpe-<vocab>.json    the tokenizer trained on corpus.txt
    <slug>/bpe-<vocab>.npy     corpus.txt tokenized (uint16/uint32)
    hf/                        the `datasets` library's own cache
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from common.corpus import BUILTIN_ROWS, builtin_rows, tokenizer_path  # noqa: F401 (BUILTIN_ROWS: served here too)
from common.datasets import DATASET_BUILTIN, DATASET_HUB  # noqa: F401 (the names this module serves)

HUB_TIMEOUT_S = 5  # an unreachable hub must cost seconds, not the minutes of default retries


# -- files -------------------------------------------------------------------------------------


def slug(dataset: str) -> str:
    return dataset.replace("/", "__")


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_corpus(folder: Path, rows: list[str], source: dict) -> Path:
    lines = [" ".join(r.split()) for r in rows]
    lines = [line for line in lines if line]
    corpus = folder / "corpus.txt"
    _write_atomic(corpus, ("\n".join(lines) + "\n").encode())
    source = {**source, "rows": len(lines), "chars": sum(map(len, lines)), "written": time.time()}
    _write_atomic(folder / "source.json", json.dumps(source, indent=1).encode())
    return corpus


def _warn(message: str) -> None:
    print(f"\n!!! cpubench data: {message}\n", file=sys.stderr, flush=True)


def _write_builtin(data_dir: Path) -> Path:
    folder = data_dir / slug(DATASET_BUILTIN)
    if not (folder / "corpus.txt").exists():
        _write_corpus(folder, builtin_rows(), {"dataset": DATASET_BUILTIN, "from": "worker.data.builtin_rows(seed=0)"})
    return folder / "corpus.txt"


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


def prepare(data_dir: str | os.PathLike, dataset: str) -> tuple[Path, str]:
    """Make sure the corpus of `dataset` is on disk: (corpus file, dataset really used).

    Call once per worker, in the parent. For the hub dataset, a corpus written by an earlier call is
    reused; otherwise the hub is tried once (seconds when unreachable) and on failure the built-in
    corpus is used, loudly, and the decision is remembered in unreachable.json so runs do not retry.
    """
    from common.errors import BenchError  # the parent's half: the child never gets here normally

    data_dir = Path(data_dir)
    if dataset == DATASET_BUILTIN:
        return _write_builtin(data_dir), DATASET_BUILTIN
    if dataset != DATASET_HUB:
        raise BenchError(f"dataset={dataset!r}: expected {DATASET_HUB} or {DATASET_BUILTIN}")
    folder = data_dir / slug(dataset)
    if (folder / "corpus.txt").exists():
        return folder / "corpus.txt", dataset
    why_not = _hub_reachable()
    try:
        rows = _load_hub_rows(dataset, data_dir / "hf", offline=why_not is not None)
        if not rows:
            raise BenchError(f"{dataset}: no text rows")
    except Exception as e:  # any loader failure means: train on the built-in corpus, and say so
        reason = f"{type(e).__name__}: {e}" + (f" (probe: {why_not})" if why_not else "")
        _warn(f"could not load {dataset} ({reason}); training on the BUILT-IN corpus instead. "
              f"Every run records dataset_used='{DATASET_BUILTIN}'.")
        _write_atomic(folder / "unreachable.json",
                      json.dumps({"dataset": dataset, "reason": reason, "when": time.time()}).encode())
        return _write_builtin(data_dir), DATASET_BUILTIN
    with contextlib.suppress(FileNotFoundError):
        (folder / "unreachable.json").unlink()
    return _write_corpus(folder, rows, {"dataset": dataset, "from": "datasets.load_dataset", "split": "train"}), dataset


def locate(data_dir: str | os.PathLike, dataset: str) -> tuple[Path, str]:
    """In the child: the corpus prepare() left, honouring its remembered fallback; no network.

    Calls prepare() only when nothing was prepared (e.g. `bench.py once` on a fresh checkout).
    """
    data_dir = Path(data_dir)
    if dataset == DATASET_HUB:
        folder = data_dir / slug(dataset)
        if (folder / "corpus.txt").exists():
            return folder / "corpus.txt", dataset
        if (folder / "unreachable.json").exists():
            _warn(f"{dataset} was unreachable at prepare(); training on the BUILT-IN corpus.")
            return _write_builtin(data_dir), DATASET_BUILTIN
    elif (data_dir / slug(dataset) / "corpus.txt").exists():
        return data_dir / slug(dataset) / "corpus.txt", dataset
    return prepare(data_dir, dataset)


# -- tokenizer and ids -------------------------------------------------------------------------


def train_tokenizer(corpus: Path, vocab_size: int):
    """A byte-level BPE trained on the corpus, cached per (dataset, vocab_size) beside it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path = tokenizer_path(corpus, vocab_size)
    if path.exists():
        return Tokenizer.from_file(str(path))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(corpus)], trainer)
    _write_atomic(path, tok.to_str().encode())
    return tok


# In a fork server: the token ids hold() loaded before forking, by .npy path -> (its stat then, the ids).
_HELD: dict[str, tuple[tuple, np.ndarray]] = {}


def _file_key(path: Path) -> tuple:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def hold(data_dir: str | os.PathLike, dataset: str, vocab_size: int) -> None:
    """In a fork server, before forking a job's child: keep in memory the token ids that child's
    locate() + load_tokens() will ask for, when prepare() and an earlier child left them on disk, so
    every later child of the same corpus and vocabulary shares them instead of reading them again.
    Never trains a tokenizer or writes anything here (its thread pool must not be forked)."""
    folder = Path(data_dir) / slug(dataset)
    if dataset == DATASET_HUB and not (folder / "corpus.txt").exists() and (folder / "unreachable.json").exists():
        folder = Path(data_dir) / slug(DATASET_BUILTIN)  # locate()'s remembered fallback
    npy = folder / f"bpe-{vocab_size}.npy"
    try:
        key = _file_key(npy)
    except OSError:
        return
    if _HELD.get(str(npy), (None,))[0] != key:
        _HELD[str(npy)] = (key, np.load(npy))


def load_tokens(corpus: Path, vocab_size: int) -> np.ndarray:
    """The whole corpus as one stream of token ids (rows joined by newlines), cached as .npy (and
    held in memory by a fork server, hold(), while that file is unchanged).

    A small corpus may give a BPE vocabulary smaller than vocab_size; ids then stay below it and the
    model's embedding still has vocab_size rows (the model's shape is the variable, not the text's).
    """
    npy = corpus.parent / f"bpe-{vocab_size}.npy"
    held = _HELD.get(str(npy))
    if held is not None:
        with contextlib.suppress(OSError):
            if _file_key(npy) == held[0]:
                return held[1]
    if npy.exists():
        return np.load(npy)
    tok = train_tokenizer(corpus, vocab_size)
    ids = tok.encode(corpus.read_text()).ids
    assert max(ids) < vocab_size, "the tokenizer produced an id beyond vocab_size"
    arr = np.asarray(ids, dtype=np.uint16 if vocab_size <= 1 << 16 else np.uint32)
    buf = io.BytesIO()  # np.save into memory, so the .npy is written atomically like the rest
    np.save(buf, arr)
    _write_atomic(npy, buf.getvalue())
    return arr


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
