"""`hgrn2 data corpus`: documents from installed packages, deterministic split by document, size cap, atomic output,
HTML stripping, and clear errors when a source is missing."""

import errno
import gzip
import json
import pathlib

import pytest

from hgrn2.cli import main
from hgrn2.data import corpus
from hgrn2.data.corpus import assemble, documents, html_to_text, parse_size

PAGE = """<!DOCTYPE html><html><head><title>T</title><script>var x = "no";</script><style>p {}</style></head>
<body><nav>Navigation bar</nav>
<div class="body" role="main"><section><h1>Spam &amp; eggs<a class="headerlink" href="#s">¶</a></h1>
<p>First   paragraph,
wrapped.</p><div><p>Nested <code>code</code> text.</p></div><hr/>
<pre>  indented
    code</pre></section></div>
<footer>Footer text</footer></body></html>"""


def _files(out: pathlib.Path, split: str) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((out / split).iterdir())}


def test_python_docs_split_by_document_deterministic(tmp_path):
    out = assemble("python-docs", tmp_path / "a", progress=False)
    m = json.loads((out / "manifest.json").read_text())
    docs = dict(documents("python-docs"))
    train, valid = _files(out, "train"), _files(out, "valid")
    assert len(train) + len(valid) == len(docs) >= 50 and len(valid) == round(0.1 * len(docs))
    assert set(m["documents"]["train"]).isdisjoint(m["documents"]["valid"])
    assert sorted(m["documents"]["train"] + m["documents"]["valid"]) == sorted(docs)
    for split, files in (("train", train), ("valid", valid)):
        assert m["splits"][split] == {"documents": len(files), "bytes": sum(len(t.encode()) for t in files.values())}
        for name in m["documents"][split]:  # every document written whole
            assert files[corpus._file_name(name)] == docs[name] + "\n"
    assert "The \"assert\" statement" in docs["python-docs/assert"]
    again = assemble("python-docs", tmp_path / "b", progress=False)
    assert _files(again, "train") == train and _files(again, "valid") == valid
    assert not list(tmp_path.glob(".*tmp*"))


def test_max_bytes_keeps_whole_documents_and_reports_the_rest(tmp_path, capsys):
    assert main(["data", "corpus", "python-docs", str(tmp_path / "c"), "--max-bytes", "60K"]) == 0
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    kept = m["splits"]["train"]["bytes"] + m["splits"]["valid"]["bytes"]
    total = sum(len(t.encode()) + 1 for _, t in documents("python-docs"))
    assert kept <= 60_000 and kept + m["left_out"]["bytes"] == total and m["left_out"]["documents"] > 0
    assert "left out by --max-bytes" in capsys.readouterr().out
    with pytest.raises(ValueError, match="fit in max_bytes=10"):
        assemble("python-docs", tmp_path / "d", max_bytes=10, progress=False)
    assert not (tmp_path / "d").exists()


def test_existing_output_and_full_disk(tmp_path, monkeypatch, capsys):
    out = assemble("python-docs", tmp_path / "c", max_bytes=50_000, progress=False)
    before = _files(out, "train")
    assert main(["data", "corpus", "python-docs", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--overwrite" in err and err.count("\n") == 1

    real = pathlib.Path.write_text
    calls = []

    def full_disk(self, *a, **kw):
        calls.append(self)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *a, **kw)

    monkeypatch.setattr(pathlib.Path, "write_text", full_disk)
    with pytest.raises(OSError, match="No space left"):
        assemble("python-docs", out, overwrite=True, progress=False)
    monkeypatch.undo()
    assert _files(out, "train") == before  # the old corpus is intact and no temporary folder is left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]
    assemble("python-docs", out, max_bytes=100_000, overwrite=True, progress=False)
    assert json.loads((out / "manifest.json").read_text())["max_bytes"] == 100_000


def test_overwrite_replaces_only_a_corpus(tmp_path, capsys):
    """--overwrite replaces a corpus this command wrote, or an empty folder; a folder of other files or a plain file
    is refused in one line naming out_dir, and left as it was."""
    other = tmp_path / "thesis"
    other.mkdir()
    (other / "thesis.tex").write_text("precious")
    plain = tmp_path / "notes.txt"
    plain.write_text("x")
    for out, says in ((other, "not a corpus"), (plain, "is a file")):
        assert main(["data", "corpus", "python-docs", str(out), "--overwrite", "--max-bytes", "50K"]) == 2
        err = capsys.readouterr().err
        assert "out_dir" in err and says in err and err.count("\n") == 1
    assert (other / "thesis.tex").read_text() == "precious" and plain.read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "thesis"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["data", "corpus", "python-docs", str(empty), "--overwrite", "--max-bytes", "50K"]) == 0
    assert (empty / "manifest.json").is_file()


def test_debian_docs_from_a_doc_tree(tmp_path):
    root = tmp_path / "doc"
    html = root / "python3.11" / "html"
    (html / "library").mkdir(parents=True)
    (html / "library" / "spam.html").write_text(PAGE)
    (html / "genindex-A.html").write_text("<p>index</p>")  # indexes and the _sources copies are skipped
    (html / "_sources" / "library").mkdir(parents=True)
    (html / "_sources" / "library" / "spam.rst.txt").write_text("duplicate")
    lin = root / "linux-doc-6.1" / "Documentation"
    (lin / "admin-guide").mkdir(parents=True)
    (lin / "translations" / "zh_CN").mkdir(parents=True)
    with gzip.open(lin / "admin-guide" / "README.rst.gz", "wt") as f:
        f.write("Linux kernel\n============\n\n\n\nRelease notes.   \n")
    (lin / "process.txt").write_text("Submitting patches.\n")
    (lin / "translations" / "zh_CN" / "index.rst").write_text("translated")
    (lin / "admin-guide" / "logo.svg").write_text("<svg/>")
    (root / "python3").mkdir()
    (root / "python3" / "html").symlink_to("../python3.11/html")  # as python3-doc ships it: read once
    (lin / "process2.txt").write_text("Submitting patches.\n")  # an exact repeat: kept once
    docs = dict(documents("debian-docs", root))
    assert docs == {
        "linux-doc-6.1/Documentation/admin-guide/README.rst": "Linux kernel\n============\n\nRelease notes.",
        "linux-doc-6.1/Documentation/process.txt": "Submitting patches.",
        "python3.11/html/library/spam.html": corpus._normalise(html_to_text(PAGE)),
    }
    out = assemble("debian-docs", tmp_path / "c", doc_root=root, val_fraction=0.3, progress=False)
    assert len(_files(out, "train")) == 2 and len(_files(out, "valid")) == 1


def test_html_to_text_keeps_main_content_only():
    text = corpus._normalise(html_to_text(PAGE))
    assert text == "Spam & eggs\n\nFirst paragraph, wrapped.\n\nNested code text.\n\n  indented\n    code"
    assert html_to_text("<body><p>a</p><p>b</p></body>").split() == ["a", "b"]  # no role="main": the body


def test_missing_source_and_bad_arguments(tmp_path, capsys):
    assert main(["data", "corpus", "debian-docs", str(tmp_path / "c"), "--doc-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "apt-get install python3-doc linux-doc" in err and err.count("\n") == 1
    assert not (tmp_path / "c").exists()
    with pytest.raises(ValueError, match="source: expected one of"):
        assemble("wiki", tmp_path / "c")
    with pytest.raises(ValueError, match="val_fraction"):
        assemble("python-docs", tmp_path / "c", val_fraction=1.0)
    assert parse_size("2M") == 2_000_000 and parse_size("1.5k") == 1500 and parse_size("123") == 123
    with pytest.raises(ValueError, match="expected a size like 500000, 2M or 1.5G, got 'lots'"):
        parse_size("lots")
