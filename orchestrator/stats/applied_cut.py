"""What the report reads of a run's `applied`, cut from it as the runs are read (rows.read_results).

A real run's `applied` is ~3 KB of JSON, and no two runs' are alike: each holds its own timed window,
setup phases and read-back time. A million runs held whole are 3 GB of text before anything is parsed,
and parsing them takes ~45 us each. The report reads only a few of its keys:
    READ_KEYS  ran.RAN_FROM's read-backs, the affinity and the GEMM peak (ran.py): the same for the runs
               of a configuration on a machine
    WINDOW     the timed window, which only ran.disturbed() reads, and only for a run whose own figures
               could pass a limit: a run that ran.surely_quiet() passes is not disturbed whatever its
               window says
cut() keeps those keys' JSON text as the run wrote it (msgspec finds them without building the rest),
the window only where it can matter, as one small JSON object per run; the runs of a configuration then
hold one shared text, parsed once, and read the same values from it as from the whole text.

A text this cannot read as a JSON object (NaN, which json reads and msgspec does not; anything not an
object) is left whole: ran.py reads it as it always did.

A run also stores those keys apart, in runs.applied_read (read_text, written with `applied` when the run
finishes): ~0.8 KB the report reads in place of ~3 KB, which the PostgreSQL server then never fetches from
its out-of-line storage. That text begins with READ_PREFIX, the tag of the keys it holds; a run whose text
holds another release's keys (or none) is read from its whole `applied` (rows.read_results).
"""

from __future__ import annotations

import hashlib
from itertools import repeat
from operator import attrgetter

import msgspec
from msgspec import Raw

from orchestrator.stats.ran import RAN_FROM, surely_quiet

READ_KEYS = tuple(dict.fromkeys([key for where, key in RAN_FROM.values() if where == "applied"]
                                + ["affinity", "peak_gflops"]))
WINDOW = "timed_window"

# a key the text does not hold reads as an empty Raw (a JSON value is never empty)
_Read = msgspec.defstruct("_Read", [(k, Raw, Raw(b"")) for k in (*READ_KEYS, WINDOW)])
_decode = msgspec.json.Decoder(_Read).decode
_read_keys = attrgetter(*READ_KEYS)
_NAMES = (*READ_KEYS, WINDOW)
# the tag a read text starts with: the keys it holds, and the form it holds them in
READ_OF = hashlib.sha256("\0".join(("raw values, v1",) + _NAMES).encode()).hexdigest()[:12]
READ_PREFIX = '{"read_of": "' + READ_OF + '"'


def cut(texts, others=None, steals=None, cores=None) -> list:
    """Each run's `applied` (texts: a column of a chunk of runs, None where NULL) cut to READ_KEYS, and
    WINDOW where the run's other_cpu_s, steal_s and cores do not pass ran.surely_quiet. Equal cuts are
    one str object."""
    made: dict[bytes, str] = {}
    out = []
    append = out.append
    for text, other, steal, cpus in zip(texts, others or repeat(None), steals or repeat(None), cores or repeat(None)):
        if not isinstance(text, str):
            append(text)
            continue
        try:
            read = _decode(text)
        except (msgspec.DecodeError, msgspec.ValidationError):
            append(text)  # not a JSON object msgspec reads: whole, for ran.py to read as before
            continue
        # the keys' texts in one bytes, apart by NUL (which msgspec reads nowhere in a JSON text)
        key = b"\0".join(_read_keys(read))
        window = read.timed_window
        if window and not surely_quiet(other, steal, cpus):
            key = b"\0".join((key, window))
        got = made.get(key)
        if got is None:
            got = made[key] = "{" + ", ".join(f'"{name}": {raw.decode()}' for name, raw
                                              in zip(_NAMES, key.split(b"\0")) if raw) + "}"
        append(got)
    return out


def read_text(applied) -> str | None:
    """What runs.applied_read holds for a run's `applied` (its JSON text): READ_PREFIX, then each of READ_KEYS
    and WINDOW it holds, its JSON text as written. cut() reads it as it reads the whole text. None where
    `applied` is not a text msgspec reads as a JSON object (the report then reads the whole text)."""
    if not isinstance(applied, str):
        return None
    try:
        read = _decode(applied)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return ", ".join([READ_PREFIX, *(f'"{name}": {bytes(raw).decode()}' for name in _NAMES
                                     if (raw := getattr(read, name)))]) + "}"
