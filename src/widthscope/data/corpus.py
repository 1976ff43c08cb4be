r"""Text corpora a researcher already has, read as documents, tokenized, cut into sequences.

**Formats** (:func:`documents`), chosen by what the path is — never by reading a binary file as
text:

==================================  ===========================================================
path                                documents
==================================  ===========================================================
``.txt`` (or any text file)         the file (read in 64 KiB pieces cut at line ends)
directory of files                  one per file that is text *by content*, sorted by path;
                                    binary files are skipped and counted
``.jsonl`` / ``.json``              one per record, field ``text_field`` (default ``text``)
``.csv`` / ``.parquet``             one per row, column ``text_field`` (default ``text``); CSV
                                    cells are read verbatim (``NA``, ``null`` stay text)
``datasets.save_to_disk`` directory one per row of the dataset (a ``DatasetDict``: its
                                    ``split``, default ``train``)
folder of split files               one per record of the files of ``split`` (None: of every
                                    file); see :func:`split_files`
==================================  ===========================================================

**Splits** (:func:`split_files`, :func:`choose_splits`): a folder of table files named the way
the Hugging Face Hub names them — ``train-00000-of-00001.parquet``, ``data/validation-*.jsonl``,
``train.csv`` / ``test.csv``, ``train/*.parquet`` — holds the dataset's own splits, as does a
``DatasetDict`` directory; :func:`choose_splits` picks the split of each pool (train: ``train``,
held-out: ``validation``, else ``test``) so the two are never pooled and re-split.

Tabular formats are read with the ``datasets`` library in streaming mode, so a multi-GB file is
never loaded whole. A file whose bytes are not text (magic bytes of Parquet, zip, gzip, PDF,
images, safetensors, ...; NUL bytes; more than 1% invalid UTF-8 in its first 64 KiB) is refused
when given as text, with the format it looks like.

**Sequences** (:func:`sequences`): ``concatenate`` tokenizes documents without special tokens,
joins them with the tokenizer's EOS (or SEP) token, cuts the stream into chunks of ``seq_len``
tokens and drops the tail (the published protocol); ``per-document`` makes one sequence per
document (special tokens added, truncated to ``seq_len``, right-padded, with an attention mask:
padded positions carry no loss); ``truncate`` keeps each document whose tokens (special tokens
added) number at least ``seq_len``, cut to ``seq_len`` (the alignment script's default without
``--concatenate``: the first B records with at least L tokens). Empty and whitespace-only
documents are skipped before tokenizing (``empty="skip"``, the published rule) or kept
(``empty="eos"``: in concatenated chunks each adds its separator). Reading stops when ``limit``
sequences exist, so only what the pools need is tokenized.

Example::

    >>> import tempfile, pathlib
    >>> from widthscope.data.corpus import ByteTokenizer, documents, sequences
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> _ = p.write_text("hello world, " * 20)
    >>> docs, source = documents(p)
    >>> seqs = sequences(docs, ByteTokenizer(), seq_len=16, mode="concatenate", limit=10)
    >>> seqs.ids.shape, seqs.mask is None
    (torch.Size([10, 16]), True)
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch

from ..errors import WidthscopeError

__all__ = [
    "ByteTokenizer",
    "documents",
    "sequences",
    "Sequences",
    "sniff",
    "is_dataset_dir",
    "TABULAR",
    "MODES",
    "SPLIT_KEYWORDS",
    "FileSplits",
    "split_files",
    "SplitChoice",
    "choose_splits",
    "dataset_splits",
    "default_split",
]

MODES = ("concatenate", "per-document", "truncate")
TABULAR = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
_PIECE = 1 << 16  # characters of a text file tokenized at once (reading stops between pieces)
_MAGIC: list[tuple[bytes, str, str]] = [  # (prefix, format, fix)
    (b"PAR1", "Parquet file", "give it a .parquet name (the text column is --text-field)"),
    (b"PK\x03\x04", "zip archive", "extract it first"),
    (b"\x1f\x8b", "gzip-compressed file", "decompress it first (gunzip)"),
    (b"BZh", "bzip2-compressed file", "decompress it first"),
    (b"\xfd7zXZ\x00", "xz-compressed file", "decompress it first"),
    (b"(\xb5/\xfd", "zstd-compressed file", "decompress it first"),
    (b"%PDF", "PDF document", "extract its text first"),
    (b"\x89PNG", "PNG image", "image data needs an image model"),
    (b"\xff\xd8\xff", "JPEG image", "image data needs an image model"),
    (b"GIF8", "GIF image", "image data needs an image model"),
    (b"ARROW1", "Arrow IPC file", "load it with datasets and save_to_disk, then pass that directory"),
    (b"\x93NUMPY", "NumPy array file", "it holds arrays, not text"),
    (b"SQLite format 3", "SQLite database", "export the text column first"),
    (b"\x7fELF", "executable", "it is not text"),
    (b"\x80\x02", "pickle", "it is not text (and widthscope never unpickles data)"),
    (b"\x80\x04", "pickle", "it is not text (and widthscope never unpickles data)"),
]


class ByteTokenizer:
    """Bytes as tokens (vocabulary 256, no special tokens): widthscope's own byte-level models."""

    name = "bytes"
    eos_token_id = None
    sep_token_id = None
    pad_token_id = None
    mask_token_id = None
    all_special_ids: list[int] = []

    def __len__(self) -> int:
        return 256

    def encode_plain(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


# Byte-order marks of the encodings other than UTF-8 (UTF-32 first: its LE mark starts with UTF-16's).
_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32LE"),
    (b"\x00\x00\xfe\xff", "UTF-32BE"),
    (b"\xff\xfe", "UTF-16LE"),
    (b"\xfe\xff", "UTF-16BE"),
)


def unicode_bom(head: bytes) -> str | None:
    """The encoding a UTF-16/UTF-32 byte-order mark at the start of ``head`` names, else None."""
    return next((name for mark, name in _BOMS if head.startswith(mark)), None)


def sniff(path: Path) -> str | None:
    """Why ``path`` is not a text file (magic bytes, NUL bytes, invalid UTF-8), or None if it is."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    for magic, fmt, fix in _MAGIC:
        if head.startswith(magic):
            return f"is a {fmt}, not text: {fix}"
    if head[8:10] == b'{"' and len(head) > 8 and int.from_bytes(head[:8], "little") < (1 << 28):
        return "is a safetensors file (tensors), not text"
    bom = unicode_bom(head)
    if bom is not None:
        return (
            f"is {bom} text (it starts with a {bom} byte-order mark), and widthscope reads UTF-8: convert it, "
            f"e.g. iconv -f {bom[:6]} -t UTF-8 {path} > {path.stem}-utf8{path.suffix}"
        )
    if b"\x00" in head:
        return "contains NUL bytes: it is a binary file, not text"
    text = head.decode("utf-8", errors="replace")
    # A cut at the 64 KiB boundary can split one character: allow a few replacement characters.
    bad = text.count("\ufffd")
    if head and bad > max(3, 0.01 * len(text)):
        return f"is not UTF-8 text ({bad} undecodable bytes in its first {len(head)} bytes)"
    return None


def precheck(path: str | Path, what: str) -> None:
    """The cheap checks of a data path, before any model is loaded: a plain file given as text
    must be text by content; a ``.parquet`` file must carry Parquet's magic bytes."""
    path = Path(path).expanduser()
    if not path.is_file():
        return
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        with open(path, "rb") as f:
            if f.read(4) != b"PAR1":
                raise WidthscopeError(
                    f"{what} {path} is named .parquet but is not a Parquet file (no PAR1 magic bytes)"
                )
        return
    if suffix in IMAGE_SUFFIXES:
        return
    reason = sniff(path)
    if reason is not None:
        raise WidthscopeError(f"{what} {path} {reason}")


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def is_dataset_dir(path: Path) -> bool:
    """A directory written by ``datasets``' ``save_to_disk`` (a Dataset or a DatasetDict)."""
    return path.is_dir() and (
        (path / "dataset_dict.json").is_file()
        or ((path / "state.json").is_file() and (path / "dataset_info.json").is_file())
    )


# ----------------------------------------------------------------------------- splits
# The Hub's split names (``datasets.data_files.SPLIT_KEYWORDS``): a word of a file or folder name.
SPLIT_KEYWORDS: dict[str, tuple[str, ...]] = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
HELD_OUT = ("validation", "valid", "val", "dev", "test", "eval")  # the held-out split, in this order of preference
# The Hub's parquet-converted shards: ``{split}-00000-of-00003*.ext`` (``data/`` in a Hub repository).
_SHARD = re.compile(r"(?P<split>\w+(?:\.\w+)*)-\d{5}-of-\d{5}(?![0-9])")
_WORD_SEP = re.compile(r"[-._ 0-9]+")
# Files of a Hub dataset repository that are not data (``datasets.data_files.FILES_TO_IGNORE``).
_METADATA = frozenset(
    {"readme.md", "config.json", "dataset_info.json", "dataset_infos.json", "dataset_dict.json", "dummy_data.zip"}
)
TEXT_SPLIT_SUFFIXES = (".txt", ".raw", ".tokens")  # plain-text split files: ptb.train.txt, wiki.valid.raw


@dataclasses.dataclass(frozen=True)
class FileSplits:
    """A folder of split files: ``splits`` (split -> its files, in path order), the data files
    named for no split (``unassigned``), metadata files never read (``ignored``), and whether
    the files are tables or plain text (``kind``)."""

    root: Path
    splits: dict[str, list[Path]]
    unassigned: list[Path]
    ignored: list[Path]
    kind: str  # "table" | "text"

    @property
    def files(self) -> list[Path]:
        """Every data file (all splits and the unassigned ones), in path order."""
        return sorted(
            [p for ps in self.splits.values() for p in ps] + self.unassigned,
            key=lambda p: p.relative_to(self.root).as_posix(),
        )

    def names(self, files: list[Path], most: int = 3) -> str:
        rel = [p.relative_to(self.root).as_posix() for p in files]
        return ", ".join(rel[:most]) + (f", ... ({len(rel)} files)" if len(rel) > most else "")

    def describe(self, split: str | None) -> str:
        """The source in words: the split read (None: the whole folder) and its files."""
        files = self.files if split is None else self.splits[split]
        kind = (f"{files[0].suffix} " if self.kind == "table" else "text ") + ("file" if len(files) == 1 else "files")
        what = (
            f"{len(files)} {kind} under {self.root}"
            if split is None
            else f"split {split!r} of {self.root} ({len(files)} {kind}: {self.names(files)})"
        )
        return what + (f"; not read: {self.names(self.ignored)}" if self.ignored else "")


def _words(name: str) -> set[str]:
    return {w for w in _WORD_SEP.split(name.lower()) if w}


def _assign(root: Path, files: list[Path]) -> tuple[dict[Path, str], list[str]]:
    """Each file's split from its name, as the Hub assigns them: ``{split}-NNNNN-of-NNNNN``
    shards first; else a split keyword in the folder names, else in the file names. Also the
    files named for two splits (``train_test.csv``: the caller refuses them)."""
    shards = {p: m.group("split") for p in files if (m := _SHARD.match(p.name))}
    if shards:
        return shards, []
    for in_dirs in (True, False):
        got: dict[Path, str] = {}
        twice: list[str] = []
        for p in files:
            rel = p.relative_to(root)
            parts = rel.parts[:-1] if in_dirs else (p.name[: len(p.name) - len(p.suffix)],)
            words = set().union(*(_words(x) for x in parts)) if parts else set()
            hits = [s for s, keys in SPLIT_KEYWORDS.items() if words & set(keys)]
            if len(hits) > 1:
                twice.append(f"{rel.as_posix()} ({' and '.join(hits)})")
            elif hits:
                got[p] = hits[0]
        if got or twice:
            return got, twice
    return {}, []


def split_files(path: str | Path) -> FileSplits | None:
    """The dataset's own splits in a folder of split files, or None (no split names; not a folder
    of tables or of plain-text split files; a ``save_to_disk`` directory: :func:`dataset_splits`).

    Table files (.jsonl/.json/.csv/.parquet) named the way the Hub names them: shards
    ``{split}-00000-of-00001.parquet`` (any split name), else a split keyword (train/training,
    validation/valid/dev/val, test/testing/eval/evaluation) as a word of a folder name
    (``train/part-0.parquet``) or of the file name (``train.parquet``, ``wikitext-test.jsonl``).
    Files named for no split are ``unassigned``; ``README.md`` and the Hub's other metadata files
    are ``ignored``. Plain-text files (.txt/.raw/.tokens: ``ptb.train.txt``, ``wiki.valid.raw``)
    count only when every file names one split, one of them ``train``, and there are two or more.
    """
    root = Path(path).expanduser()
    if not root.is_dir() or is_dataset_dir(root):
        return None
    data, ignored, suffixes = [], [], set()
    for p in root.rglob("*"):  # stop at the first file that is neither a table nor plain text
        if not p.is_file() or any(part.startswith(".") for part in p.relative_to(root).parts):
            continue
        if p.name.lower() in _METADATA:
            ignored.append(p)
            continue
        suffix = p.suffix.lower()
        if suffix not in TABULAR and suffix not in TEXT_SPLIT_SUFFIXES:
            return None
        suffixes.add(suffix)
        data.append(p)
    kind = "table" if suffixes and suffixes <= set(TABULAR) else "text"
    if not data or (kind == "text" and not suffixes <= set(TEXT_SPLIT_SUFFIXES)):
        return None
    order = lambda p: p.relative_to(root).as_posix()  # noqa: E731
    data.sort(key=order)
    ignored.sort(key=order)
    assigned, twice = _assign(root, data)
    if twice and kind == "table":
        raise WidthscopeError(
            f"{root}: {twice[0]} is named for two splits: rename it, so each file belongs to one "
            "split (the held-out pool must never read a train file)"
        )
    names = [s for s in SPLIT_KEYWORDS if s in assigned.values()] + sorted(set(assigned.values()) - set(SPLIT_KEYWORDS))
    splits = {s: [p for p in data if assigned.get(p) == s] for s in names}
    unassigned = [p for p in data if p not in assigned]
    if not splits:
        return None
    if kind == "text" and (twice or unassigned or "train" not in splits or len(splits) < 2):
        return None  # a folder of text files whose names only happen to hold a split word: one corpus
    return FileSplits(root, splits, unassigned, ignored, kind)


def dataset_splits(path: str | Path) -> list[str] | None:
    """The split names of a folder that has its own splits — a ``DatasetDict`` directory
    (``dataset_dict.json``) or a folder of split files (:func:`split_files`) — else None."""
    root = Path(path).expanduser()
    if is_dataset_dir(root):
        if not (root / "dataset_dict.json").is_file():
            return None
        try:
            names = json.loads((root / "dataset_dict.json").read_text(encoding="utf-8")).get("splits", [])
        except (OSError, ValueError, AttributeError) as exc:
            raise WidthscopeError(f"{root}/dataset_dict.json is not a DatasetDict's split list ({exc})") from None
        return [str(n) for n in names]
    fs = split_files(root)
    return None if fs is None else list(fs.splits)


def _split_named(name: str, names: list[str], flag: str, path: Path) -> str:
    """``name`` as one of ``names`` (the Hub's aliases too: ``valid`` is ``validation``)."""
    if name in names:
        return name
    canon = next((s for s, keys in SPLIT_KEYWORDS.items() if name.lower() in keys), None)
    if canon in names:
        return str(canon)
    raise WidthscopeError(f"{flag} {name!r}: {path} has splits {', '.join(names)}; choose one of them")


def default_split(path: str | Path, role: str) -> str | None:
    """The split a pool reads from a folder with two or more splits given without ``--*-split``:
    ``train`` for the train pool, ``validation`` (else ``test``) for the held-out pool; None:
    the whole source (no splits, one split, or none of that name)."""
    names = dataset_splits(path)
    if not names or len(names) < 2:
        return None
    if role == "train":
        return "train" if "train" in names else None
    return next((n for n in HELD_OUT if n in names), None)


@dataclasses.dataclass(frozen=True)
class SplitChoice:
    """Which split of a folder with splits each pool reads (:func:`choose_splits`).

    ``train``: the train pool's split (None: the whole folder); ``test``: the held-out pool's
    split, or None when the held-out pool is cut from the train pool's corpus (``how`` ``one
    split`` or ``re-split on request``); ``integrity`` for ``heldout_integrity``; ``notes``."""

    train: str | None
    test: str | None
    how: str  # "dataset splits" | "one split" | "re-split on request"
    integrity: str
    notes: tuple[str, ...] = ()


def choose_splits(
    path: str | Path, train_split: str | None = None, test_split: str | None = None, test_fraction: float | None = None
) -> SplitChoice | None:
    """The splits the pools read from ``--data path`` when it has its own splits; None when it
    has none (one corpus, split by ``--test-fraction``).

    Two or more splits: the train pool reads ``train_split`` (default ``train``), the held-out
    pool ``test_split`` (default ``validation``, else ``test``) — never pooled, never re-split.
    One split (and no ``--*-split``): it is the one corpus, split by ``--test-fraction`` (a note
    says so). ``test_fraction`` (given explicitly) on two or more splits: re-split on request —
    both pools are cut from the one split ``train_split`` (default ``train``); the other splits
    are not read (a note says so)."""
    root = Path(path).expanduser()
    names = dataset_splits(root)
    if names is None:
        return None
    if not names:
        raise WidthscopeError(f"{root}/dataset_dict.json lists no splits")
    fs = split_files(root)
    tr = None if train_split is None else _split_named(train_split, names, "--train-split", root)
    te = None if test_split is None else _split_named(test_split, names, "--test-split", root)
    files = (lambda s: f" ({fs.names(fs.splits[s])})") if fs is not None else (lambda s: "")
    if len(names) == 1 and tr is None and te is None:  # one corpus: the folder, as before splits were known
        only = names[0]
        more = (
            f" and {len(fs.unassigned)} file(s) named for no split ({fs.names(fs.unassigned)})"
            if fs is not None and fs.unassigned
            else ""
        )
        note = (
            f"{root} holds one split only ({only!r}{files(only)}){more}: read as one corpus and split into "
            "train and held-out pools by --test-fraction (a seeded permutation of its sequences)"
        )
        integrity = (
            f"one split only ({only!r}): both pools are disjoint sequences of it (seeded permutation); "
            f"held-out only if the model never trained on split {only!r}"
        )
        return SplitChoice(only if fs is None else None, None, "one split", integrity, (note,))
    notes = []
    if fs is not None and fs.unassigned:
        notes.append(
            f"{root}: {len(fs.unassigned)} file(s) named for no split not read "
            f"({fs.names(fs.unassigned)}); the splits are {', '.join(names)}"
        )
    if test_fraction is not None:  # re-split on request: one split cut into both pools
        if te is not None:
            raise WidthscopeError(
                f"--test-fraction re-splits one split of {root} into both pools; --test-split "
                "names a held-out split of its own: drop one of them"
            )
        tr = tr or ("train" if "train" in names else None)
        if tr is None:
            raise WidthscopeError(
                f"{root} has splits {', '.join(names)} but none named train: name the split to "
                "re-split with --train-split"
            )
        unused = [n for n in names if n != tr]
        skip = f"; split{'s' if len(unused) > 1 else ''} {', '.join(unused)} not read" if unused else ""
        notes.append(
            f"{root}: split {tr!r}{files(tr)} re-split into the train and held-out pools on request "
            f"(--test-fraction {test_fraction}){skip}; held-out text is text of the same split the model "
            "may have trained on"
        )
        integrity = (
            f"re-split on request (--test-fraction {test_fraction}): both pools are disjoint sequences of "
            f"split {tr!r}{skip}; held-out only if the model never trained on split {tr!r}"
        )
        return SplitChoice(tr, None, "re-split on request", integrity, tuple(notes))
    tr = tr or "train"
    if tr not in names:
        raise WidthscopeError(
            f"{root} has splits {', '.join(names)} but none named train: name the train pool's split with --train-split"
        )
    te = te or next((n for n in HELD_OUT if n in names and n != tr), None)
    if te is None:
        raise WidthscopeError(
            f"{root} has splits {', '.join(names)} but no validation/test split: name the "
            f"held-out one with --test-split, or re-split {tr!r} with --test-fraction F"
        )
    if te == tr:
        raise WidthscopeError(
            f"--train-split and --test-split are both {tr!r}: the held-out pool must be another "
            f"split of {root} (or re-split {tr!r} with --test-fraction F)"
        )
    integrity = (
        f"the dataset's own splits: train pool only from split {tr!r}, held-out pool only from split "
        f"{te!r} (never pooled or re-split)"
    )
    return SplitChoice(tr, te, "dataset splits", integrity, tuple(notes))


def _text_pieces(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        while True:
            piece = f.read(_PIECE)
            if not piece:
                return
            rest = f.readline()  # finish the line, so pieces end at line ends
            yield piece + rest


def _column(row: dict[str, Any], field: str, where: str, i: int) -> str:
    if field not in row:
        raise WidthscopeError(
            f"{where} has no field/column {field!r} (it has: {', '.join(map(str, row))}); pass --text-field NAME"
        )
    v = row[field]
    if v is None:
        return ""
    if not isinstance(v, str):
        raise WidthscopeError(
            f"{where}: record {i} has a {type(v).__name__} in {field!r}, not text; "
            "pass --text-field with the column that holds the text"
        )
    return v


def _rows(path: Path, split: str | None) -> tuple[Iterable[dict[str, Any]], str]:
    """Rows of a tabular file or a save_to_disk directory, lazily, through ``datasets`` (local
    files need no network; the user's HF_*_OFFLINE settings are theirs, never set here)."""
    try:
        import datasets
    except ImportError:  # pragma: no cover - a dependency
        raise WidthscopeError(
            "reading .jsonl/.csv/.parquet needs the 'datasets' package: pip install datasets"
        ) from None
    datasets.disable_progress_bars()
    if path.is_dir():
        try:
            ds = datasets.load_from_disk(str(path))
        except Exception as exc:
            raise WidthscopeError(
                f"{path} could not be read as a datasets save_to_disk directory "
                f"({type(exc).__name__}: {str(exc)[:200]})"
            ) from None
        if isinstance(ds, datasets.DatasetDict):
            name = split or "train"
            if name not in ds:
                raise WidthscopeError(
                    f"{path} holds splits {', '.join(ds)}, not {name!r}: choose one with --train-split/--test-split"
                )
            return ds[name], f"datasets directory {path} split {name!r}"
        if split is not None and split != "train":
            raise WidthscopeError(f"{path} holds one dataset without splits; --*-split {split!r} does not apply")
        return ds, f"datasets directory {path}"
    builder = TABULAR[path.suffix.lower()]
    reason = sniff(path) if builder in ("json", "csv") else None
    if reason is not None:
        raise WidthscopeError(f"{path} {reason}")
    if builder == "parquet":
        with open(path, "rb") as f:
            if f.read(4) != b"PAR1":
                raise WidthscopeError(f"{path} is named .parquet but is not a Parquet file (no PAR1 magic bytes)")
    try:
        # CSV: no NA conversion, so a text cell "NA", "null", "None" or "NaN" stays that text (as in .jsonl),
        # and blank lines stay rows (empty documents, counted and skipped like empty rows of a .parquet)
        na = {"keep_default_na": False, "na_filter": False, "skip_blank_lines": False} if builder == "csv" else {}
        ds = datasets.load_dataset(builder, data_files=str(path), split="train", streaming=True, **na)
    except Exception as exc:
        raise WidthscopeError(
            f"{path} could not be read as {builder} ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None

    def rows() -> Iterator[dict[str, Any]]:
        try:
            yield from ds
        except WidthscopeError:
            raise
        except Exception as exc:  # parse errors surface while streaming
            raise WidthscopeError(
                f"{path} could not be read as {builder} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200] if str(exc) else ''})"
            ) from None

    return rows(), f"{builder} file {path}"


def documents(
    path: str | Path,
    *,
    text_field: str | None = None,
    split: str | None = None,
    label_field: str | None = None,
    skipped: list[str] | None = None,
) -> tuple[Iterator[Any], str]:
    """Documents of ``path`` (see the module docstring) and a description of the source.

    Each document is an iterator of text pieces (a long file streams in pieces), or with
    ``label_field`` a ``(pieces, label)`` pair. ``skipped`` collects ``"file: reason"`` for
    binary files skipped in a directory.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise WidthscopeError(
            f"data path {str(path)!r} does not exist; give a text file, a directory, a "
            ".jsonl/.json/.csv/.parquet file or a datasets save_to_disk directory"
        )
    tabular = is_dataset_dir(path) or (path.is_file() and path.suffix.lower() in TABULAR)
    fs = split_files(path) if path.is_dir() and not tabular else None
    if split is not None and fs is None and not is_dataset_dir(path):
        raise WidthscopeError(
            f"--*-split applies to datasets directories and folders of split files "
            f"(train-*.parquet, validation.jsonl, ...), not to {path}"
        )
    where = None
    if fs is not None:  # a folder of split files: the files of ``split`` (None: every data file)
        if split is not None and split not in fs.splits:
            raise WidthscopeError(
                f"{path} holds splits {', '.join(fs.splits)}, not {split!r}: choose one with --train-split/--test-split"
            )
        files, where = (fs.files if split is None else fs.splits[split]), fs.describe(split)
    else:
        files = _files(path) if path.is_dir() and not tabular else []
    tables = _table_files(files, path)
    if text_field is not None and not (tabular or tables):
        raise WidthscopeError(
            f"--text-field {text_field!r} applies to tables (.jsonl/.json/.csv/.parquet, datasets "
            f"directories); {path} is plain text: drop --text-field"
        )
    if label_field is not None and not (tabular or tables):
        raise WidthscopeError(
            f"labels (--label-field) need a table: {path} is not a .jsonl/.json/.csv/.parquet "
            "file or a datasets directory"
        )
    field = text_field or "text"
    if tables:  # a folder of .jsonl/.csv/... files: the records of each, in path order
        src = where or f"{len(tables)} {tables[0].suffix} files under {path}"
        return _table_docs(tables, field, label_field), f"{src}, field {field!r}"
    if tabular:
        rows, source = _rows(path, split)

        def gen() -> Iterator[Any]:
            for i, row in enumerate(rows):
                text = _column(row, field, str(path), i)
                if label_field is None:
                    yield iter([text])
                    continue
                if label_field not in row:
                    raise WidthscopeError(
                        f"{path} has no label column {label_field!r} (it has: "
                        f"{', '.join(map(str, row))}); pass --label-field NAME"
                    )
                yield iter([text]), row[label_field]

        return gen(), f"{source}, field {field!r}"
    if path.is_file():
        reason = sniff(path)
        if reason is not None:
            raise WidthscopeError(f"{path} {reason}")
        return iter([_text_pieces(path)]), f"text file {path}"
    good = []
    for p in files:
        reason = sniff(p)
        if reason is None:
            good.append(p)
        elif skipped is not None:
            skipped.append(f"{p.relative_to(path)}: {reason.split(':')[0]}")
    if not good:
        raise WidthscopeError(
            f"{path}: none of its {len(files)} files is text (by content); point --data at "
            "a directory of text files, or at a .jsonl/.csv/.parquet file"
        )
    return (_text_pieces(p) for p in good), where or f"{len(good)} text files under {path}"


def _files(path: Path) -> list[Path]:
    return sorted(
        (
            p
            for p in path.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        ),
        key=lambda p: p.relative_to(path).as_posix(),
    )


def _table_files(files: list[Path], path: Path) -> list[Path]:
    """The files of a folder that holds only tables (.jsonl/.json/.csv/.parquet), read record by
    record; [] otherwise (a folder with any other file is a text folder: code corpora hold .json)."""
    if not files or any(p.suffix.lower() not in TABULAR for p in files):
        return []
    kinds = {TABULAR[p.suffix.lower()] for p in files}
    if len(kinds) > 1:
        raise WidthscopeError(f"{path} mixes table formats ({', '.join(sorted(kinds))}): keep one format per folder")
    return files


def _table_docs(tables: list[Path], field: str, label_field: str | None) -> Iterator[Any]:
    for t in tables:
        docs, _ = documents(t, text_field=field, label_field=label_field)
        yield from docs


@dataclasses.dataclass
class Sequences:
    """Token sequences ``ids (n, T)``; ``mask`` (per-document mode) or None; ``labels`` or None."""

    ids: torch.Tensor
    mask: torch.Tensor | None
    labels: torch.Tensor | None
    documents: int
    tokens: int
    exhausted: bool
    separator: int | None
    dropped_short: int = 0
    unknown: int = 0
    empty_docs: int = 0  # empty or whitespace-only documents read (skipped or kept: see ``empty``)


def _encode(tok: Any) -> Callable[[str], list[int]]:
    if isinstance(tok, ByteTokenizer):
        return tok.encode_plain
    return lambda text: tok(text, add_special_tokens=False)["input_ids"]


def sequences(
    docs: Iterator[Any],
    tokenizer: Any,
    *,
    seq_len: int,
    mode: str = "concatenate",
    limit: int | None = None,
    max_tokens: int | None = None,
    labels: bool = False,
    show_progress: bool = False,
    desc: str = "tokenize",
    empty: str = "skip",
) -> Sequences:
    """Cut documents into sequences of ``seq_len`` tokens (see the module docstring).

    Stops at ``limit`` sequences or after ``max_tokens`` tokens were read (``None``: no limit).
    ``empty``: ``"skip"`` empty / whitespace-only documents, or ``"eos"`` keep them.
    """
    if mode not in MODES:
        raise WidthscopeError(f"--sequences {mode!r}: choose {', '.join(MODES)}")
    if empty not in ("skip", "eos"):
        raise WidthscopeError(f"--empty-docs {empty!r}: choose skip or eos")
    if labels and mode != "per-document":
        raise WidthscopeError("labelled data (sequence classification) needs --sequences per-document")
    from .._io import progress

    encode = _encode(tokenizer)
    sep = getattr(tokenizer, "eos_token_id", None)
    if sep is None:
        sep = getattr(tokenizer, "sep_token_id", None)
    bar = progress(total=limit, desc=desc, disable=None if show_progress else True, unit="seq")
    exhausted = True
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = 0 if pad is None else int(pad)
    unk_id = getattr(tokenizer, "unk_token_id", None)
    if unk_id is not None and unk_id in (sep, getattr(tokenizer, "eos_token_id", None)):
        unk_id = None  # byte-level BPEs name EOS as "unknown"; they have no unknown token
    cut = _Cut(
        tokenizer,
        encode,
        seq_len=seq_len,
        limit=limit,
        max_tokens=max_tokens,
        labels=labels,
        sep=sep,
        pad=pad,
        unk_id=unk_id,
        skip=empty == "skip",
        bar=bar,
    )
    step = {"concatenate": _cut_concatenate, "truncate": _cut_truncate}.get(mode, _cut_per_document)
    try:
        for doc in docs:
            pieces, y = doc if labels else (doc, None)
            cut.n_docs += 1
            if not step(cut, pieces, y):
                continue  # a document not taken: the limits are checked after the next one
            if cut.full():
                exhausted = False
                break
    finally:
        bar.close()
    _check_tokenizer(cut)
    return _assemble(cut, mode, exhausted)


@dataclasses.dataclass
class _Cut:
    """The settings of one :func:`sequences` call, what it has cut so far, and its counters."""

    tokenizer: Any
    encode: Callable[[str], list[int]]
    seq_len: int
    limit: int | None
    max_tokens: int | None
    labels: bool
    sep: int | None
    pad: int
    unk_id: int | None
    skip: bool
    bar: Any
    rows: list[list[int]] = dataclasses.field(default_factory=list)
    masks: list[list[int]] = dataclasses.field(default_factory=list)
    ys: list[Any] = dataclasses.field(default_factory=list)
    buf: list[int] = dataclasses.field(default_factory=list)
    n_docs: int = 0
    n_tokens: int = 0
    short: int = 0
    n_unk: int = 0
    empty: int = 0  # non-blank documents that gave no tokens
    nonblank: int = 0
    blank_docs: int = 0

    def full(self) -> bool:
        """``limit`` sequences cut, or ``max_tokens`` tokens read."""
        return (self.limit is not None and len(self.rows) >= self.limit) or (
            self.max_tokens is not None and self.n_tokens >= self.max_tokens
        )


def _cut_concatenate(c: _Cut, pieces: Iterable[str], y: Any) -> bool:
    """One document into the running buffer, then its separator; full chunks become rows."""
    got, has_text = 0, False
    for piece in _nonblank_first(pieces) if c.skip else pieces:
        ids = c.encode(piece)
        c.n_tokens += len(ids)
        got += len(ids)
        has_text = has_text or bool(piece.strip())
        if c.unk_id is not None:
            c.n_unk += ids.count(c.unk_id)
        c.buf.extend(ids)
        while len(c.buf) >= c.seq_len and (c.limit is None or len(c.rows) < c.limit):
            c.rows.append(c.buf[: c.seq_len])
            del c.buf[: c.seq_len]
            c.bar.update(1)
        if c.full():
            break  # a long document: stop inside it
    c.nonblank += has_text
    c.empty += has_text and got == 0
    c.blank_docs += not has_text
    if c.sep is not None and (has_text or not c.skip):
        c.buf.append(int(c.sep))
        if len(c.buf) >= c.seq_len and (c.limit is None or len(c.rows) < c.limit):
            c.rows.append(c.buf[: c.seq_len])  # the separator completed a chunk
            del c.buf[: c.seq_len]
            c.bar.update(1)
    return True


def _cut_truncate(c: _Cut, pieces: Iterable[str], y: Any) -> bool:
    """The first ``seq_len`` tokens of one document; False if it is blank or too short."""
    tokenizer = c.tokenizer
    text = "".join(pieces)
    if not text.strip():
        c.blank_docs += 1
        return False  # (kept, it would be shorter than seq_len anyway)
    if isinstance(tokenizer, ByteTokenizer):
        ids = tokenizer.encode_plain(text)
    else:
        ids = tokenizer(text, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
    c.n_tokens += len(ids)
    c.nonblank += 1
    if not isinstance(tokenizer, ByteTokenizer):
        c.empty += 1 if not c.encode(text[:2000]) else 0
    if len(ids) < c.seq_len:
        c.short += 1  # fewer than seq_len tokens: not taken (the published rule)
        if c.unk_id is not None:
            c.n_unk += ids.count(c.unk_id)
        return False
    if c.unk_id is not None:
        c.n_unk += ids.count(c.unk_id)
    c.rows.append(ids[: c.seq_len])
    c.bar.update(1)
    return True


def _cut_per_document(c: _Cut, pieces: Iterable[str], y: Any) -> bool:
    """One document as one padded row (with its mask and label); False if it is not taken."""
    tokenizer, seq_len = c.tokenizer, c.seq_len
    text = "".join(pieces)
    if not text.strip():
        c.blank_docs += 1
        if c.skip:
            return False
    if isinstance(tokenizer, ByteTokenizer):
        ids = tokenizer.encode_plain(text)[:seq_len]
    else:
        ids = tokenizer(text, add_special_tokens=True, truncation=True, max_length=seq_len)["input_ids"]
    c.n_tokens += len(ids)
    if c.unk_id is not None:
        c.n_unk += ids.count(c.unk_id)
    if text.strip():
        c.nonblank += 1
        plain = len(_encode(tokenizer)(text[:2000])) if not isinstance(tokenizer, ByteTokenizer) else 1
        c.empty += 1 if plain == 0 else 0
    if len(ids) < 2 and not c.labels:
        c.short += 1  # no token to predict
        return False
    if not ids:
        c.short += 1
        return False
    c.rows.append(ids + [c.pad] * (seq_len - len(ids)))
    c.masks.append([1] * len(ids) + [0] * (seq_len - len(ids)))
    c.ys.append(y)
    c.bar.update(1)
    return True


def _check_tokenizer(c: _Cut) -> None:
    """Refuse a tokenizer that cannot read the text: most documents gave no tokens, or more
    than 5% of the tokens are its unknown token."""
    tokenizer, empty, nonblank, n_unk, n_tokens = c.tokenizer, c.empty, c.nonblank, c.n_unk, c.n_tokens
    name = getattr(tokenizer, "name_or_path", None) or getattr(tokenizer, "name", "?")
    if nonblank and empty > 0.5 * nonblank:
        raise WidthscopeError(
            f"the tokenizer ({name}) turned {empty} of {nonblank} non-empty documents into no "
            "tokens at all: it cannot read this text (wrong tokenizer?); pass the matching one "
            "with --tokenizer"
        )
    if c.unk_id is not None and n_tokens and n_unk > 0.05 * n_tokens:
        raise WidthscopeError(
            f"the tokenizer ({name}) maps {n_unk} of {n_tokens} tokens ({n_unk / n_tokens:.0%}) "
            "to its unknown token: it does not cover this text (wrong tokenizer or language?)"
        )


def _assemble(c: _Cut, mode: str, exhausted: bool) -> Sequences:
    """The rows (and masks, labels) as tensors."""
    seq_len = c.seq_len
    ids_t = torch.tensor(c.rows, dtype=torch.int64) if c.rows else torch.zeros(0, seq_len, dtype=torch.int64)
    mask_t = (
        None
        if mode != "per-document"
        else (torch.tensor(c.masks, dtype=torch.int64) if c.masks else torch.zeros(0, seq_len, dtype=torch.int64))
    )
    lab_t = None
    if c.labels:
        bad = [y for y in c.ys if not isinstance(y, int) or isinstance(y, bool)]
        if bad:
            raise WidthscopeError(
                f"labels must be integer class ids, got {bad[0]!r}: map the label column to 0..num_labels-1 first"
            )
        lab_t = torch.tensor(c.ys, dtype=torch.int64)
    return Sequences(
        ids_t,
        mask_t,
        lab_t,
        c.n_docs,
        c.n_tokens,
        exhausted,
        None if mode != "concatenate" else c.sep,
        c.short,
        c.n_unk,
        c.blank_docs,
    )


def _nonblank_first(pieces: Iterable[str]) -> Iterator[str]:
    """The pieces of a document, holding back leading whitespace-only pieces until text follows
    (a document that is whitespace throughout yields nothing: it is skipped whole)."""
    seen, pending = False, []
    for piece in pieces:
        if not seen and not piece.strip():
            pending.append(piece)
            continue
        if not seen:
            yield from pending
            pending.clear()
            seen = True
        yield piece
