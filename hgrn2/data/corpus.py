"""`hgrn2 data corpus SOURCE OUT_DIR`: a folder of plain-text documents assembled from text shipped with installed
packages, so a real corpus is at hand offline.

Sources:
    python-docs   CPython's own `pydoc_data.topics` (the `help()` topics; always installed, about 0.5-1 MB)
    debian-docs   Debian's documentation packages: python3.X-doc's HTML manual (tags stripped) and linux-doc-*'s
                  Documentation/*.rst|*.txt (English only); tens of MB with both installed

Output (the whole folder appears at once, by renaming a finished temporary folder):
    train/*.txt, valid/*.txt   one document per file; a document goes to valid by a hash of its name
    manifest.json              source, documents and bytes per split, documents left out by max_bytes

Feed it to `hgrn2 data prepare OUT_DIR/train --val-inputs OUT_DIR/valid --sample-by document ...`.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path

FORMAT = "hgrn2-text-corpus-v1"
DOC_ROOT = "/usr/share/doc"
DEBIAN_PACKAGES = "python3-doc linux-doc"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", choices=sorted(SOURCES), help="where the text comes from")
    parser.add_argument("out_dir", help="output folder (train/, valid/, manifest.json)")
    parser.add_argument("--max-bytes", type=parse_size, default=None, metavar="SIZE",
                        help="keep at most this much text, e.g. 2M or 50M (default: everything)")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="fraction of documents held out")
    parser.add_argument("--doc-root", default=DOC_ROOT, help="where debian-docs looks for documentation")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR")


def run(args: argparse.Namespace) -> int:
    try:
        out = assemble(args.source, args.out_dir, args.max_bytes, val_fraction=args.val_fraction,
                       doc_root=args.doc_root, overwrite=args.overwrite)
    except (ValueError, FileNotFoundError, FileExistsError, OSError) as e:
        print(f"hgrn2 data corpus: error: {e}", file=sys.stderr)
        return 2
    m = json.loads((out / "manifest.json").read_text())
    s = m["splits"]
    left = f"; {m['left_out']['documents']} documents left out by --max-bytes" if m["left_out"]["documents"] else ""
    print(f"wrote {out}: train {s['train']['documents']} docs ({s['train']['bytes']:,} bytes), "
          f"valid {s['valid']['documents']} docs ({s['valid']['bytes']:,} bytes){left}")
    return 0


class SizeError(argparse.ArgumentTypeError, ValueError):
    """A size that `parse_size` cannot read: argparse prints it after the argument's name."""


def parse_size(text: str) -> int:
    """'2M' -> 2_000_000 (K, M, G are powers of 1000); a plain integer is bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)B?\s*", str(text), re.I)
    if not m:
        raise SizeError(f"expected a size like 500000, 2M or 1.5G, got {text!r}")
    n = int(float(m.group(1)) * 1000 ** " KMG".index(m.group(2).upper() or " "))
    if n < 1:
        raise SizeError(f"expected a positive size, got {text!r}")
    return n


# ----------------------------------------------------------------------------------------------------------------
# the public API


def assemble(source: str, out_dir: str | os.PathLike, max_bytes: int | None = None, *, val_fraction: float = 0.1,
             doc_root: str | os.PathLike = DOC_ROOT, overwrite: bool = False, progress: bool = True) -> Path:
    """Write `source`'s documents to `out_dir/{train,valid}/*.txt` plus `manifest.json`; returns `out_dir`.

    Deterministic: documents are ordered by a hash of their names, `max_bytes` keeps the longest prefix of that
    order that fits (a document is never cut), and the first `val_fraction` of the kept ones go to valid.
    """
    if source not in SOURCES:
        raise ValueError(f"source: expected one of {sorted(SOURCES)}, got {source!r}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction: expected a number in (0, 1), got {val_fraction}")
    if max_bytes is not None and max_bytes < 1:
        raise ValueError(f"max_bytes: expected a positive number of bytes, got {max_bytes}")
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"out_dir: {str(out)!r} already exists; pass --overwrite to replace it")
    if out.exists():
        _check_replaceable(out)
    docs = sorted(_read_all(source, Path(doc_root), progress), key=lambda d: _hash(d[0]))
    kept, left_out = _fit(docs, max_bytes)
    if len(kept) < 2:
        raise ValueError(f"{source}: {len(kept)} document(s) fit in max_bytes={max_bytes}; need at least 2 "
                         f"(one for train, one for valid)")
    n_val = min(len(kept) - 1, max(1, round(val_fraction * len(kept))))
    splits = {"valid": kept[:n_val], "train": kept[n_val:]}
    manifest = {
        "format": FORMAT, "source": source, "python": sys.version.split()[0], "val_fraction": val_fraction,
        "max_bytes": max_bytes,
        "splits": {k: {"documents": len(v), "bytes": sum(_nbytes(t) for _, t in v)} for k, v in splits.items()},
        "left_out": {"documents": len(left_out), "bytes": sum(_nbytes(t) for _, t in left_out)},
        "documents": {k: [name for name, _ in v] for k, v in splits.items()},
    }
    _write_atomically(out, splits, manifest, overwrite)
    return out


def documents(source: str, doc_root: str | os.PathLike = DOC_ROOT) -> Iterator[tuple[str, str]]:
    """(name, text) of every non-empty document of `source`, in a fixed order; names are unique paths.

    A missing source raises here, before the first document is read."""
    return _load(_entries(source, Path(doc_root)))


def _entries(source: str, doc_root: Path) -> list[tuple[str, Callable[[], str]]]:
    if source not in SOURCES:
        raise ValueError(f"source: expected one of {sorted(SOURCES)}, got {source!r}")
    return SOURCES[source](doc_root)


def _load(entries: list[tuple[str, Callable[[], str]]]) -> Iterator[tuple[str, str]]:
    """Normalised texts; empty ones and exact repeats (one page shipped by two packages) are dropped."""
    seen: set[str] = set()
    for name, read in entries:
        text = _normalise(read())
        key = _hash(text)
        if text and key not in seen:
            seen.add(key)
            yield name, text


# ----------------------------------------------------------------------------------------------------------------
# sources: each lists (name, reader) in a fixed order, checking up front that the source is there


def _python_docs(doc_root: Path) -> list[tuple[str, Callable[[], str]]]:
    from pydoc_data.topics import topics

    return [(f"python-docs/{key}", lambda key=key: topics[key]) for key in sorted(topics)]


def _debian_docs(doc_root: Path) -> list[tuple[str, Callable[[], str]]]:
    files = _debian_files(doc_root)
    if not files:
        raise FileNotFoundError(f"debian-docs: no Debian documentation packages under {str(doc_root)!r} "
                                f"(python3.X-doc, linux-doc-*); install them with "
                                f"`sudo apt-get install {DEBIAN_PACKAGES}`")
    return [(re.sub(r"\.gz$", "", name), lambda p=p: _read_doc(p)) for name, p in files]


def _read_doc(path: Path) -> str:
    raw = _read_text(path)
    return html_to_text(raw) if ".html" in path.suffixes else raw


def _debian_files(doc_root: Path) -> list[tuple[str, Path]]:
    """(name, path) of python3.X-doc's pages (not its indexes or _sources copies) and linux-doc's English .rst/.txt,
    sorted; a file reached through symlinks (python3/html -> python3.11-doc/html) is named by its real path."""
    skip_html = re.compile(r"(^|/)(_sources|_static|_images|_downloads)/|(^|/)(genindex[^/]*|search|py-modindex)"
                           r"\.html$")
    python = [p for p in doc_root.glob("python3*/html/**/*.html")
              if not skip_html.search(p.relative_to(doc_root).as_posix())]
    linux = [p for pattern in ("*.rst", "*.rst.gz", "*.txt", "*.txt.gz")
             for p in doc_root.glob(f"linux-doc-*/Documentation/**/{pattern}")
             if "/translations/" not in p.as_posix()]
    root = doc_root.resolve()
    real = {p.resolve(): p for p in sorted(python + linux, reverse=True) if p.is_file()}
    return sorted((r.relative_to(root).as_posix() if r.is_relative_to(root) else p.relative_to(doc_root).as_posix(), p)
                  for r, p in real.items())


SOURCES: dict[str, Callable[[Path], list[tuple[str, Callable[[], str]]]]] = {
    "python-docs": _python_docs,
    "debian-docs": _debian_docs,
}


def _read_text(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------------------------------------------
# HTML to text with the standard library's parser


class _TextExtractor(HTMLParser):
    """Text of a page's main content (Sphinx's role="main" element if present, else <body>), one block a line."""

    BLOCK = {"p", "div", "section", "article", "br", "li", "dt", "dd", "tr", "pre", "table", "ul", "ol", "dl",
             "blockquote", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "figcaption"}
    SKIP = {"script", "style", "nav", "head", "title", "template", "noscript"}
    VOID = {"br", "hr", "img", "input", "meta", "link", "area", "base", "col", "embed", "source", "track", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.main_parts: list[str] = []
        self.body_parts: list[str] = []
        self.stack: list[tuple[str, bool, bool]] = []  # (tag, opened the main element, is a '¶' anchor)
        self.in_main = self.skip = self.pre = self.headerlink = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        is_main = attrs.get("role") == "main" and not self.in_main
        is_link = tag == "a" and "headerlink" in (attrs.get("class") or "")
        if tag not in self.VOID:
            self.stack.append((tag, is_main, is_link))
            self._enter((tag, is_main, is_link), 1)
        if tag in self.BLOCK:
            self._emit("\n")

    def handle_endtag(self, tag):
        if tag not in {entry[0] for entry in self.stack}:
            return  # a stray end tag
        while self.stack:
            entry = self.stack.pop()
            self._enter(entry, -1)
            if entry[0] == tag:
                break
        if tag in self.BLOCK:
            self._emit("\n")

    def _enter(self, entry: tuple[str, bool, bool], sign: int) -> None:
        tag, is_main, is_link = entry
        self.in_main += sign * is_main
        self.skip += sign * (tag in self.SKIP)
        self.pre += sign * (tag == "pre")
        self.headerlink += sign * is_link

    def handle_data(self, data):
        if self.skip or self.headerlink:
            return
        self._emit(data if self.pre else re.sub(r"\s+", " ", data))

    def _emit(self, text: str) -> None:
        (self.main_parts if self.in_main else self.body_parts).append(text)

    def text(self) -> str:
        return "".join(self.main_parts or self.body_parts)


def html_to_text(html: str) -> str:
    """Readable text of an HTML page: scripts, styles and navigation dropped, one paragraph per line."""
    p = _TextExtractor()
    p.feed(html)
    p.close()
    return p.text()


# ----------------------------------------------------------------------------------------------------------------
# selection and writing


def _normalise(text: str) -> str:
    """Trailing spaces off every line, at most one blank line in a row, no blank lines at either end."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")


def _hash(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def _nbytes(text: str) -> int:
    return len(text.encode()) + 1  # written with a final newline


def _read_all(source: str, doc_root: Path, progress: bool) -> list[tuple[str, str]]:
    from tqdm.auto import tqdm

    entries = _entries(source, doc_root)
    bar = tqdm(entries, desc=f"reading {source}", unit="doc", disable=not progress, dynamic_ncols=True)
    return list(_load(bar))


def _fit(docs: list[tuple[str, str]], max_bytes: int | None):
    """Documents (in the given order) that fit in `max_bytes` together, and those left out."""
    if max_bytes is None:
        return docs, []
    kept, left, used = [], [], 0
    for doc in docs:
        n = _nbytes(doc[1])
        if used + n <= max_bytes:
            kept.append(doc)
            used += n
        else:
            left.append(doc)
    return kept, left


def _file_name(name: str) -> str:
    """A flat, portable file name for a document name ('a/b c.html' -> 'a__b_c.html.txt')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name.replace("/", "__")) + ".txt"


def _check_replaceable(out: Path) -> None:
    """--overwrite replaces an empty folder or one this command wrote, never anything else."""
    if not out.is_dir():
        raise ValueError(f"out_dir: {str(out)!r} is a file, not a corpus folder")
    if not any(out.iterdir()):
        return
    try:
        fmt = json.loads((out / "manifest.json").read_text()).get("format")
    except (OSError, ValueError, AttributeError):
        fmt = None
    if fmt != FORMAT:
        raise ValueError(f"out_dir: {str(out)!r} holds files that are not a corpus of `hgrn2 data corpus` (no "
                         f"manifest.json of format {FORMAT!r}); --overwrite replaces only such a corpus")


def _write_atomically(out: Path, splits: dict, manifest: dict, overwrite: bool) -> None:
    """Write into a temporary sibling folder, then rename it to `out`; a failure (a full disk) leaves no trace."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for split, docs in splits.items():
            (tmp / split).mkdir(parents=True)
            names = [_file_name(name) for name, _ in docs]
            if len(set(names)) != len(names):
                raise ValueError(f"two documents map to the same file name in {split}")
            for fname, (_, text) in zip(names, docs, strict=True):
                (tmp / split / fname).write_text(text + "\n", encoding="utf-8")
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        if out.exists() and overwrite:
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
