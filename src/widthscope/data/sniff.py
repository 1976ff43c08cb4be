"""Is a file text (:func:`sniff`: magic bytes, byte-order marks, NUL bytes, invalid UTF-8)? Also the
cheap checks of a data path before any model loads (:func:`precheck`), ``datasets`` directories and
the text files of a folder."""

from __future__ import annotations

from pathlib import Path

from ..errors import WidthscopeError

__all__ = [
    "TABULAR",
    "IMAGE_SUFFIXES",
    "sniff",
    "precheck",
    "unicode_bom",
    "is_dataset_dir",
    "files_under",
    "text_only",
]

TABULAR = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
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


def precheck(path: str | Path, what: str = "") -> None:
    """Refuse a plain file given as text that is not text, or a ``.parquet`` file that is not Parquet."""
    path = Path(path).expanduser()
    if not path.is_file() or path.suffix.lower() in IMAGE_SUFFIXES:
        return
    if path.suffix.lower() == ".parquet":
        with open(path, "rb") as f:
            reason = (
                None if f.read(4) == b"PAR1" else "is named .parquet but is not a Parquet file (no PAR1 magic bytes)"
            )
    else:
        reason = sniff(path)
    if reason is not None:
        raise WidthscopeError(f"{what} {path} {reason}".lstrip())


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def is_dataset_dir(path: Path) -> bool:
    """A directory written by ``datasets``' ``save_to_disk`` (a Dataset or a DatasetDict)."""
    return path.is_dir() and (
        (path / "dataset_dict.json").is_file()
        or ((path / "state.json").is_file() and (path / "dataset_info.json").is_file())
    )


def files_under(path: Path) -> list[Path]:
    """The files under ``path`` in path order, hidden ones left out."""
    return sorted(
        (
            p
            for p in path.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        ),
        key=lambda p: p.relative_to(path).as_posix(),
    )


def text_only(files: list[Path], root: Path) -> tuple[list[Path], list[str]]:
    """The ``files`` that are text by content, and ``"file: why"`` for the others."""
    why = {p: sniff(p) for p in files}
    skipped = [f"{p.relative_to(root)}: {r.split(':')[0]}" for p, r in why.items() if r is not None]
    return [p for p in files if why[p] is None], skipped
