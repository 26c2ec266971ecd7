"""The project's own corpus: the deterministic built-in text worker/data.py writes when no real text can
be fetched, the file names of a prepared corpus (its training and held-out text, where its tokenizer is
cached) and the row split of a corpus without a split of its own. Here, where both the worker (training)
and the orchestrator (the cost model's tokens per word) can read it. Imports nothing from the project.
"""

from __future__ import annotations

import random
from pathlib import Path

BUILTIN_ROWS = 1000  # the hub dataset's size, so both corpora give comparable runs


TRAIN_FILE = "train.txt"  # the text a run trains on (and its tokenizer is trained on)
VAL_FILE = "val.txt"  # the held-out text, never trained on
VAL_FRACTION = 0.1  # of the rows (or, for a corpus of whole works, of the characters) held out


def tokenizer_path(train: Path, vocab_size: int) -> Path:
    """The BPE of vocab_size trained on the training text `train` (a name an older release's tokenizers,
    `bpe-<vocab>.json`, trained on the whole text, cannot be mistaken for)."""
    return train.parent / f"tokenizer-{vocab_size}.json"


def split_rows(rows: list[str]) -> tuple[list[str], list[str]]:
    """(training rows, held-out rows): the last VAL_FRACTION of the rows, at least one, held out."""
    if len(rows) < 2:
        raise ValueError(f"{len(rows)} row(s): a split needs at least two")
    n_val = max(1, round(len(rows) * VAL_FRACTION))
    return rows[:-n_val], rows[-n_val:]


_SUBJECTS = [
    "the sun", "a plant", "the moon", "water", "a magnet", "the heart", "a seed", "the wind", "ice",
    "a rock", "the earth", "a battery", "light", "sound", "a cell", "the river", "a volcano",
    "the ocean", "a bird", "a fish", "the forest", "a glacier", "the lungs", "a bee", "copper wire",
    "a cloud", "the soil", "a star", "an insect", "the brain", "a mirror", "a lever", "a frog",
]
_VERBS = [
    "absorbs", "reflects", "produces", "needs", "changes", "moves", "stores", "releases", "carries",
    "heats", "cools", "protects", "feeds on", "depends on", "breaks down", "pulls", "pushes",
    "measures", "forms", "supports",
]
_OBJECTS = [
    "energy", "heat", "oxygen", "carbon dioxide", "sunlight", "nutrients", "electric current",
    "pressure", "small particles", "salt", "minerals", "seeds", "waves", "food", "blood", "rain",
    "layers of sediment", "magnetic fields", "moisture", "tiny crystals",
]
_ADVERBS = ["slowly", "quickly", "every day", "during the night", "in the spring", "over many years",
            "when it is warm", "when the air is cold", "in most cases", "at high altitude"]
_REASONS = [
    "because it helps the organism survive", "which is why scientists study it closely",
    "so the temperature stays nearly constant", "and this changes the local environment",
    "which makes the process easy to observe", "because energy is never created or destroyed",
    "so the system reaches a balance", "which students can test with a simple experiment",
]
_QUESTIONS = [
    "Which of the following best explains why {s} {v} {o}?",
    "What would happen if {s} no longer {v} {o}?",
    "A student observes that {s} {v} {o} {a}. What is the most likely cause?",
    "How does {s} use {o}?",
]
_FACTS = [
    "{S} {v} {o} {a}, {r}.",
    "In a simple model, {s} {v} {o} {r}.",
    "Scientists found that {s} {v} more {o} {a}.",
    "{S} {v} {o}; without it, {s2} would not get enough {o2}.",
    "When {s} {v} {o}, {s2} {v2} {o2} as well.",
    "Most of the {o} that {s} {v} comes from {s2}.",
    "An experiment showed that {s} {v} {o} {a}, {r}.",
]


_SYLLABLES = ["ka", "lor", "mi", "ven", "tas", "ro", "quel", "dan", "phi", "ser", "bo", "tri", "gal", "nu",
              "mes", "cor", "ith", "pla", "zen", "ux", "dre", "ol", "fen", "sa", "wy", "thar", "ei", "mon"]
_KINDS = [("mineral", "ite"), ("beetle", "id"), ("fern", "ia"), ("river", ""), ("moth", "a"), ("island", ""),
          ("bacterium", "us"), ("alloy", "ium"), ("lake", ""), ("comet", "")]
_CLAIMS = [
    "The {t} is a kind of {k} first described in {y}.",
    "A sample of {t} weighs about {n} grams and {v} {o}.",
    "Near the {t2}, the {t} {v} {o} {a}.",
    "Researchers measured {n} units of {o} in the {t}.",
    "Unlike the {t2}, the {t} {v} {o} {r}.",
]


def _names(rng: random.Random, count: int) -> list[tuple[str, str]]:
    """Invented proper names (kelvorite, Sadanmes river...): thousands of word types, so a BPE of a
    few thousand tokens has subwords to learn, as it would on real text."""
    names = []
    for _ in range(count):
        kind, suffix = rng.choice(_KINDS)
        stem = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
        names.append((stem + suffix, kind))
    return names


def builtin_rows(n_rows: int = BUILTIN_ROWS, seed: int = 0) -> list[str]:
    """About a thousand varied English-like rows about science: deterministic, no download.

    Structure repeats (shared templates and vocabulary) so a small model's loss falls within a few
    steps, while random choices keep rows distinct so the model cannot just memorize one line.
    """
    rng = random.Random(seed)

    names = _names(rng, 3000)

    def fill(template: str) -> str:
        (t, k), (t2, _) = rng.sample(names, 2)
        s, s2 = rng.sample(_SUBJECTS, 2)
        o, o2 = rng.sample(_OBJECTS, 2)
        v, v2 = rng.sample(_VERBS, 2)
        text = template.format(t=t, k=k, t2=t2, y=rng.randint(1650, 2020),
                               n=round(rng.uniform(0.1, 500), rng.randint(0, 2)), s=s, S=s[0].upper() + s[1:], s2=s2,
                               v=v, v2=v2, o=o, o2=o2,
                               a=rng.choice(_ADVERBS), r=rng.choice(_REASONS))
        return text[0].upper() + text[1:]

    rows = []
    for _ in range(n_rows):
        parts = [fill(rng.choice(_FACTS if rng.random() < 0.6 else _CLAIMS)) for _ in range(rng.randint(3, 8))]
        if rng.random() < 0.3:
            parts.append(fill(rng.choice(_QUESTIONS)))
        rows.append(" ".join(parts))
    return rows
