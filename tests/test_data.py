"""The corpus, its tokenizer and the batches: cached, deterministic, and loud about the fallback."""

import json

import numpy as np
import pytest

from worker.data import DATASET_BUILTIN, DATASET_HUB
from worker import data


def test_builtin_corpus_is_deterministic_varied_and_about_a_thousand_rows():
    rows = data.builtin_rows()
    assert rows == data.builtin_rows()
    assert len(rows) == 1000 and len(set(rows)) == 1000
    words = {w.strip(".,;?").lower() for r in rows for w in r.split()}
    assert len(words) > 2000  # enough word types for a BPE of a few thousand tokens
    assert data.builtin_rows(seed=1) != rows


def test_prepare_builtin_writes_the_corpus_and_where_it_came_from(tmp_path):
    corpus, used = data.prepare(tmp_path, DATASET_BUILTIN)
    assert used == DATASET_BUILTIN
    assert len(corpus.read_text().splitlines()) == 1000
    source = json.loads((corpus.parent / "source.json").read_text())
    assert source["dataset"] == DATASET_BUILTIN and source["rows"] == 1000
    assert not list(tmp_path.rglob("*.tmp"))


def test_unreachable_hub_falls_back_to_builtin_loudly_and_runs_remember_it(tmp_path, capfd):
    corpus, used = data.prepare(tmp_path, DATASET_HUB)
    if used == DATASET_HUB:
        pytest.skip("the hub is reachable here: nothing to fall back from")
    assert used == DATASET_BUILTIN
    assert "BUILT-IN" in capfd.readouterr().err
    assert (tmp_path / data.slug(DATASET_HUB) / "unreachable.json").exists()
    assert data.locate(tmp_path, DATASET_HUB) == (corpus, DATASET_BUILTIN)  # no second hub try
    assert "BUILT-IN" in capfd.readouterr().err


def test_locate_prepares_when_nothing_was_prepared(tmp_path):
    corpus, used = data.locate(tmp_path, DATASET_BUILTIN)
    assert corpus.exists() and used == DATASET_BUILTIN


def test_tokenizer_and_ids_are_cached_per_vocab_size_and_stay_below_it(tmp_path):
    corpus, _ = data.prepare(tmp_path, DATASET_BUILTIN)
    small = data.load_tokens(corpus, 300)
    large = data.load_tokens(corpus, 1000)
    assert small.max() < 300 and large.max() < 1000
    assert len(small) > len(large)  # a bigger vocabulary merges more: fewer tokens
    assert data.tokenizer_path(corpus, 300).exists() and data.tokenizer_path(corpus, 1000).exists()
    assert np.array_equal(data.load_tokens(corpus, 300), small)  # read back from the .npy cache
    assert not list(tmp_path.rglob("*.tmp"))


def test_batches_are_next_token_windows_deterministic_from_the_seed():
    stream = np.arange(1000, dtype=np.uint16)
    x, y = data.Batches(stream, seq_len=16, batch_size=4, seed=3).next()
    assert x.shape == y.shape == (4, 16) and x.dtype == np.int64 and isinstance(x, np.ndarray)
    assert np.array_equal(y[:, :-1], x[:, 1:]) and np.array_equal(y[:, -1], x[:, -1] + 1)
    again, _ = data.Batches(stream, seq_len=16, batch_size=4, seed=3).next()
    other, _ = data.Batches(stream, seq_len=16, batch_size=4, seed=4).next()
    assert np.array_equal(x, again) and not np.array_equal(x, other)


def test_a_fork_server_holds_the_ids_while_their_file_is_unchanged(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "_HELD", {})
    corpus, _ = data.prepare(tmp_path, DATASET_BUILTIN)
    data.hold(tmp_path, DATASET_BUILTIN, 300)  # nothing on disk yet: nothing held, nothing written
    assert data._HELD == {} and not data.tokenizer_path(corpus, 300).exists()
    ids = data.load_tokens(corpus, 300)  # the first child writes the .npy
    data.hold(tmp_path, DATASET_BUILTIN, 300)
    held = data.load_tokens(corpus, 300)
    assert np.array_equal(held, ids) and held is data.load_tokens(corpus, 300)  # from memory, not the file
    npy = corpus.parent / "bpe-300.npy"
    np.save(npy.with_suffix(".new.npy"), ids[:100])
    npy.with_suffix(".new.npy").replace(npy)  # the file changed after the server held it: the file wins
    assert len(data.load_tokens(corpus, 300)) == 100


def test_hold_follows_the_remembered_fallback_of_an_unreachable_hub(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "_HELD", {})
    corpus, _ = data.prepare(tmp_path, DATASET_BUILTIN)
    ids = data.load_tokens(corpus, 300)
    (tmp_path / data.slug(DATASET_HUB)).mkdir()
    (tmp_path / data.slug(DATASET_HUB) / "unreachable.json").write_text("{}")
    data.hold(tmp_path, DATASET_HUB, 300)
    assert list(data._HELD) == [str(corpus.parent / "bpe-300.npy")]
    assert np.array_equal(data._HELD[str(corpus.parent / "bpe-300.npy")][1], ids)
