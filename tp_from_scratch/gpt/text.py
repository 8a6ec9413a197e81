"""Real text without a download: the Python standard library's own source, read from the
running interpreter, as bytes (a byte-level tokenizer: V = 256, token = byte value).

The corpus is a fixed list of modules (FILES) that every CPython 3.10-3.13 ships, read in that
order and joined; the last VALIDATION_FRACTION of its bytes is held out for validation. The
text differs a little between Python versions, so ``corpus()`` also returns its sha256: a run
reports the hash it trained on, and two runs are comparable when the hashes agree.

Batches, like the Markov chain's (data.py), are a pure function of (seed, step, split):
B windows of T + 1 bytes at seeded random offsets into the split.
"""
import hashlib
import sysconfig
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

VOCAB_SIZE = 256
VALIDATION_FRACTION = 0.1
FILES = ("argparse.py", "ast.py", "base64.py", "bisect.py", "calendar.py", "colorsys.py", "contextlib.py",
         "copy.py", "csv.py", "dataclasses.py", "difflib.py", "enum.py", "fnmatch.py", "fractions.py",
         "functools.py", "glob.py", "heapq.py", "inspect.py", "json/__init__.py", "json/decoder.py",
         "json/encoder.py", "keyword.py", "operator.py", "pprint.py", "queue.py", "random.py", "shlex.py",
         "shutil.py", "statistics.py", "string.py", "textwrap.py", "tokenize.py", "typing.py", "uuid.py",
         "weakref.py")


@lru_cache(maxsize=1)
def corpus():
    """(bytes of the whole corpus as a read-only uint8 array, its sha256 hex digest)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    missing = [f for f in FILES if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(f"the standard library at {root} lacks {missing}: no text corpus")
    data = b"\n".join((root / f).read_bytes() for f in FILES)
    array = np.frombuffer(data, dtype=np.uint8)
    return array, hashlib.sha256(data).hexdigest()


def split(name):
    """The bytes of the "train" or "val" split (uint8 array)."""
    data, _ = corpus()
    cut = int(len(data) * (1 - VALIDATION_FRACTION))
    if name == "train":
        return data[:cut]
    if name == "val":
        return data[cut:]
    raise ValueError(f"split must be 'train' or 'val', got {name!r}")


def text_batch(step, batch_size, seq_len, seed, split_name="train"):
    """Inputs and next-byte targets, both (B, T) int64, from seeded random windows of a split."""
    data = split(split_name)
    rng = np.random.default_rng([seed, step, 0 if split_name == "train" else 1])
    starts = rng.integers(0, len(data) - seq_len - 1, size=batch_size)
    windows = np.stack([data[s:s + seq_len + 1] for s in starts]).astype(np.int64)  # (B, T+1)
    tokens = torch.from_numpy(windows)
    return tokens[:, :-1], tokens[:, 1:]


def encode(text):
    """Token ids of a string: its UTF-8 bytes."""
    return list(text.encode("utf-8"))


def decode(ids):
    """The string of byte token ids (invalid UTF-8 shown as U+FFFD)."""
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
