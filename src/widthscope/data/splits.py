"""A dataset's own splits (folders of split files named as the Hub names them, ``DatasetDict``
directories) and which split each probe pool reads (:func:`choose_splits`)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from ..errors import WidthscopeError
from .sniff import TABULAR, files_under, is_dataset_dir

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
    """A folder of split files: each split's files, unassigned and ignored files, ``kind`` and all files."""

    root: Path
    splits: dict[str, list[Path]]
    unassigned: list[Path]
    ignored: list[Path]
    kind: str  # "table" | "text"
    files: list[Path]  # every data file (all splits and the unassigned ones), in path order

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
    """Each file's split as the Hub assigns them from names, and the files named for two splits."""
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
    """The splits of a folder of tables or plain-text files named as the Hub names them, else None."""
    root = Path(path).expanduser()
    if not root.is_dir() or is_dataset_dir(root):
        return None
    data, ignored, suffixes = [], [], set()
    for p in files_under(root):
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
    return FileSplits(root, splits, unassigned, ignored, kind, data)


def dataset_splits(path: str | Path) -> list[str] | None:
    """The split names of a ``DatasetDict`` directory or a folder of split files, else None."""
    root = Path(path).expanduser()
    if is_dataset_dir(root):
        if not (root / "dataset_dict.json").is_file():
            return None
        try:
            names = json.loads((root / "dataset_dict.json").read_text(encoding="utf-8")).get("splits", [])
        except (OSError, ValueError, AttributeError) as exc:
            raise WidthscopeError(f"{root}/dataset_dict.json is not a DatasetDict's split list ({exc})") from None
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise WidthscopeError(
                f"{root}/dataset_dict.json is not a valid DatasetDict: 'splits' must be a list of split "
                f"names, got {json.dumps(names)[:80]}; save it again with DatasetDict.save_to_disk"
            )
        return list(names)
    fs = split_files(root)
    return None if fs is None else list(fs.splits)


def _split_named(name: str, names: list[str], flag: str, path: Path | str) -> str:
    """``name`` as one of ``names`` (the Hub's aliases too: ``valid`` is ``validation``)."""
    if name in names:
        return name
    canon = next((s for s, keys in SPLIT_KEYWORDS.items() if name.lower() in keys), None)
    if canon in names:
        return str(canon)
    raise WidthscopeError(f"{flag} {name!r}: {path} has splits {', '.join(names)}; choose one of them")


@dataclasses.dataclass(frozen=True)
class SplitChoice:
    """Which split each pool reads (None: the whole source; ``test`` None: cut from the train split)."""

    train: str | None
    test: str | None
    how: str  # "dataset splits" | "one split" | "re-split on request"
    integrity: str
    notes: tuple[str, ...] = ()


def choose_splits(
    path: str | Path, train_split: str | None = None, test_split: str | None = None, test_fraction: float | None = None
) -> SplitChoice | None:
    """The splits the pools read from ``--data path`` (None: it has no splits)."""
    root = Path(path).expanduser()
    names = dataset_splits(root)
    if names is None:
        return None
    if not names:
        raise WidthscopeError(f"{root}/dataset_dict.json lists no splits")
    return choose_among(names, str(root), split_files(root), train_split, test_split, test_fraction)


def choose_among(
    names: list[str],
    root: str,
    fs: FileSplits | None = None,
    train_split: str | None = None,
    test_split: str | None = None,
    test_fraction: float | None = None,
) -> SplitChoice:
    """:func:`choose_splits` for a source whose split ``names`` are known (``fs``: its split files)."""
    tr = None if train_split is None else _split_named(train_split, names, "--train-split", root)
    te = None if test_split is None else _split_named(test_split, names, "--test-split", root)
    files = (lambda s: f" ({fs.names(fs.splits[s])})") if fs is not None else (lambda s: "")
    if len(names) == 1 and tr is None and te is None:  # one corpus: the whole folder
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
