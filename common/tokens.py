"""The run's tokenizer: the byte-level BPE recipe (new_bpe) that worker/data.py trains on a corpus's
training text, and the tokens per word of the project's corpus under it (tokens_per_word: what
`predict --epochs` and the report's epochs of WikiText convert word counts with). Imports nothing
from the project but common/.
"""

from __future__ import annotations

from functools import lru_cache

from common.paths import REPO

RATIOS_FILE = "cpubench-tokens-per-word.json"
_ratios: dict[tuple, tuple[float, str]] = {}


def new_bpe(vocab_size: int):
    """(an untrained byte-level BPE tokenizer, the trainer that trains it to vocab_size): the recipe
    every run's tokenizer is made by."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    return tok, trainer


def tokens_per_word(vocab_size: int, data_dir=None) -> tuple[float, str]:
    """tokens_per_word_uncached(), once per process and vocabulary, and once per corpus, vocabulary and
    tokenizers version on this machine (a file in the temporary directory, RATIOS_FILE): a BPE trains in
    about half a second, and every report asks for four vocabularies."""
    key = (vocab_size, str(data_dir))
    if key not in _ratios:
        _ratios[key] = _stored_ratio(vocab_size, data_dir)
    return _ratios[key]


def _stored_ratio(vocab_size: int, data_dir=None) -> tuple[float, str]:
    """The ratio from RATIOS_FILE when it holds one for this corpus (its text's hash), vocabulary and
    tokenizers version; else computed and added (atomically; a file that cannot be read or written is
    only a missed cache)."""
    import hashlib
    import json
    import tempfile
    from pathlib import Path
    import tokenizers
    from common.files import write_atomic
    _, text = corpus_text(data_dir)
    digest = hashlib.sha256(text.encode()).hexdigest()
    entry = f"{digest}:{vocab_size}:{tokenizers.__version__}"
    path = Path(tempfile.gettempdir()) / RATIOS_FILE
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        stored = {}
    if entry in stored:
        ratio, where = stored[entry]
        return float(ratio), where
    ratio, where = tokens_per_word_uncached(vocab_size, data_dir)
    stored[entry] = [ratio, where]
    try:
        write_atomic(path, json.dumps(stored))
    except OSError:
        pass
    return ratio, where


def corpus_text(data_dir=None):
    """(the project's corpus file, its training text): the file's where a run wrote it, else the built-in
    rows' (builtin_text)."""
    from pathlib import Path
    from common.corpus import TRAIN_FILE
    corpus = Path(data_dir or REPO / "data") / "builtin" / TRAIN_FILE
    return corpus, corpus.read_text() if corpus.exists() else builtin_text()


@lru_cache(maxsize=1)
def builtin_text() -> str:
    """The built-in corpus's training text where no corpus file was written (common.corpus: the same
    rows each time), made once per process: a report asks for four vocabularies' ratios, and making
    the rows takes ~0.2 s."""
    from common.corpus import builtin_rows, split_rows
    return "\n".join(split_rows(builtin_rows())[0])


def tokens_per_word_uncached(vocab_size: int, data_dir=None) -> tuple[float, str]:
    """Tokens per whitespace-separated word of the project's corpus (its training text) under the run's
    tokenizer (new_bpe() of vocab_size trained on that text, as worker/data.py trains it), and where
    the corpus came from. Reads the cached tokenizer where a run left one; otherwise trains one in
    memory (nothing is written)."""
    from tokenizers import Tokenizer
    from common.corpus import tokenizer_path
    corpus, text = corpus_text(data_dir)
    cached = tokenizer_path(corpus, vocab_size)
    if cached.exists():
        tok = Tokenizer.from_file(str(cached))
    else:
        tok, trainer = new_bpe(vocab_size)
        tok.train_from_iterator(text.splitlines(), trainer)
    words = len(text.split())
    return len(tok.encode(text).ids) / words, "the project's built-in corpus"
