"""The sharded `hgrn2 data prepare`: the same bytes for any number of workers, parts merged, resumed after a kill or
a full disk, the Pile's and SlimPajama's .jsonl.zst layouts, and the loader over shards."""

import hashlib
import json
import os
import random

import numpy as np
import pytest
import torch

from hgrn2.data import shards as S
from hgrn2.data.packed import PackedDataset, StepSampler, read_meta, read_split, train_loader
from hgrn2.data.prepare import merge, prepare, write_corpus
from hgrn2.data.tokenizer import load_tokenizer, train_bpe
from tests.train.helpers import FullDisk

WORDS = "the cat sat on a mat dog ran far away and then slept under old green trees".split()
SHARD = 3000  # characters per shard: dozens of shards from a few hundred documents


def _docs(n, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30))) for _ in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Text files of several sizes (one large enough to be cut into byte ranges), a tokenizer."""
    d = tmp_path_factory.mktemp("shards")
    (d / "in" / "sub").mkdir(parents=True)
    docs = _docs(900, 0)
    (d / "in" / "a.txt").write_text("\n".join(docs[:40]) + "\n")
    (d / "in" / "b.txt").write_text("\n".join(docs[40:60]) + "\n")
    (d / "in" / "sub" / "big.txt").write_text("\n".join(docs[60:800]) + "\n")
    (d / "in" / "sub" / "c.txt").write_text("\n".join(docs[800:]) + "\n")
    (d / "tok").mkdir()
    train_bpe(iter(docs), 300).save(str(d / "tok" / "tokenizer.json"))
    return d


def _prepare(corpus, out, **kw):
    kw = {"tokenizer": str(corpus / "tok"), "val_fraction": 0.1, "shard_size": SHARD, "batch_docs": 7,
          "progress": False, **kw}
    return prepare([str(corpus / "in")], str(out), **kw)


def _tree(path) -> dict:
    """Every file under `path` (relative name -> sha256 of its bytes)."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def reference(corpus):
    out = corpus / "ref"
    meta = _prepare(corpus, out, workers=1)
    return out, meta


def test_any_number_of_workers_gives_the_same_bytes(corpus, reference, tmp_path):
    ref, meta = reference
    assert len(meta["splits"]["train"]["shards"]) > 10 and meta["splits"]["val"]["tokens"] > 0
    tasks = json.loads((ref / "prepare.json").read_text())["tasks"]
    assert [t["start"] for t in tasks if t["files"][0][0].endswith("big.txt")][:3] == [0, SHARD, 2 * SHARD]
    _prepare(corpus, tmp_path / "w3", workers=3)
    assert _tree(tmp_path / "w3") == _tree(ref)


def test_the_stream_holds_every_document_once_in_order(corpus, reference):
    ref, meta = reference
    tok = load_tokenizer(str(ref / "tokenizer.json"))
    eos = meta["eos_id"]
    texts = []
    for name in ("a.txt", "b.txt"):
        texts += (corpus / "in" / name).read_text().splitlines()
    for name in ("big.txt", "c.txt"):
        texts += (corpus / "in" / "sub" / name).read_text().splitlines()
    ids = np.concatenate([read_split(str(ref), "train"), read_split(str(ref), "val")])
    cuts = np.flatnonzero(ids == eos)
    got = sorted(tok.decode(ids[a + 1 : b].tolist()) for a, b in zip(np.r_[-1, cuts[:-1]], cuts))
    assert got == sorted(texts)
    train = meta["splits"]["train"]
    assert sum(s["tokens"] for s in train["shards"]) == train["tokens"] == read_split(str(ref), "train").size
    assert sum(c["documents"] for c in train["by_source"].values()) == train["documents"]


def test_parts_merged_equal_one_machine(corpus, reference, tmp_path, capsys):
    ref, _ = reference
    shared = tmp_path / "shared"  # every machine writes into one shared folder
    (shared / "shards").mkdir(parents=True)
    other = shared / "shards" / "000000-0000.train.bin.tmp"  # in flight on another machine (task 0 is not part 3's)
    other.write_bytes(b"")
    _prepare(corpus, shared, part="3/3", workers=1)
    assert other.exists()
    other.unlink()
    for i in (1, 2, 3):
        index = _prepare(corpus, shared, part=f"{i}/3", workers=1)
        assert index["part"] == [i, 3] and not (shared / "meta.json").exists()
    from hgrn2.cli import main

    assert main(["data", "merge", str(shared), str(shared)]) == 0
    meta = read_meta(str(shared))
    assert (shared / "meta.json").read_bytes() == (ref / "meta.json").read_bytes()
    assert _tree(shared / "shards") == _tree(ref / "shards")
    # parts in folders of their own (machines with their own disks): the index points into them, nothing is copied
    for i in (1, 2):
        _prepare(corpus, tmp_path / f"p{i}", part=f"{i}/2", workers=2)
    merged = merge(str(tmp_path / "m"), [str(tmp_path / "p2"), str(tmp_path / "p1")])
    assert not (tmp_path / "m" / "shards").exists()
    assert {s["file"].split("/")[1] for s in merged["splits"]["train"]["shards"]} == {"p1", "p2"}
    for split in ("train", "val"):
        assert np.array_equal(read_split(str(tmp_path / "m"), split), read_split(str(ref), split))
        assert merged["splits"][split]["by_source"] == meta["splits"][split]["by_source"]
    ds, want = PackedDataset(str(tmp_path / "m"), "train", 16), PackedDataset(str(ref), "train", 16)
    assert len(ds) == len(want) and all(torch.equal(ds[i], want[i]) for i in range(0, len(ds), 7))
    assert main(["data", "merge", str(tmp_path / "m2"), str(tmp_path / "p1")]) == 2
    assert capsys.readouterr().err.strip() == "hgrn2 data merge: error: part(s) [2] of 2 are missing"
    with pytest.raises(ValueError, match="--part: expected I/N"):
        _prepare(corpus, tmp_path / "x", part="3/2")
    with pytest.raises(ValueError, match="--part needs --tokenizer"):
        _prepare(corpus, tmp_path / "x", part="1/2", tokenizer=None, train_tokenizer=300)


class _Crash(Exception):
    pass


def test_killed_run_resumes_redoing_only_the_pieces_in_flight(corpus, reference, tmp_path, monkeypatch):
    ref, _ = reference
    out = tmp_path / "o"
    real = S.PieceWriter.finish
    calls = {"n": 0}

    def crash_on_the_fifth(self):
        calls["n"] += 1
        if calls["n"] == 5:
            raise _Crash("killed")
        return real(self)

    monkeypatch.setattr(S.PieceWriter, "finish", crash_on_the_fifth)
    with pytest.raises(_Crash):
        _prepare(corpus, out, workers=1)
    monkeypatch.undo()
    done = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (out / "shards").glob("*.bin")}
    assert len(done) >= 4 and not list((out / "shards").glob("*.tmp")) and not (out / "meta.json").exists()
    (out / "shards" / "000002-0000.train.bin.tmp").write_bytes(b"\0" * 10)  # what a SIGKILL leaves behind
    _prepare(corpus, out, workers=2)
    assert _tree(out) == _tree(ref)
    # the finished shards were kept, not written again
    for name, before in done.items():
        st = (out / "shards" / name).stat()
        assert (st.st_ino, st.st_mtime_ns) == before, name


@pytest.mark.slow
def test_sigkill_at_any_point_then_the_same_command_finishes_the_same_bytes(corpus, reference, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from tests.train.helpers import ROOT, env

    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "hgrn2.cli", "data", "prepare", str(corpus / "in"), "--tokenizer",
           str(corpus / "tok"), "--out", str(out), "--val-fraction", "0.1", "--shard-size", str(SHARD),
           "--batch-docs", "7", "--workers", "2"]
    for wait in (0.0, 4.0, 6.0):  # before, while and after the pieces are written (imports take a few seconds)
        p = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        time.sleep(wait)
        os.kill(p.pid, signal.SIGKILL)  # the main process only: its workers must end with it
        p.wait()
        time.sleep(0.5)
        alive = _running_in_group(p.pid)
        if alive:
            os.killpg(p.pid, signal.SIGKILL)
        assert not alive, f"workers {alive} of the killed prepare were still running"
    subprocess.run(cmd, cwd=ROOT, env=env(), check=True, capture_output=True, timeout=300)
    assert _tree(out) == _tree(reference[0])


def _running_in_group(pgid: int) -> list[int]:
    """Processes of a process group that are not zombies (from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        try:
            stat = open(f"/proc/{d}/stat").read() if d.isdigit() else ""
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if fields and fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(d))
    return out


def test_workers_end_with_a_killed_prepare():
    """Workers left running after their prepare is killed would write beside the rerun's."""
    import signal
    import subprocess
    import sys
    import textwrap
    import time

    from tests.train.helpers import ROOT, env

    script = textwrap.dedent("""
        import hgrn2_cli, multiprocessing as mp, os, time
        from hgrn2.data.prepare import _die_with_parent
        def work(_):
            print(os.getpid(), flush=True)
            time.sleep(60)
        with mp.get_context("fork").Pool(1, initializer=_die_with_parent, initargs=(os.getpid(),)) as pool:
            pool.map(work, [0])
    """)
    p = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env(), stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    worker = int(p.stdout.readline())
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    for _ in range(50):
        if not _running_in_group(p.pid):
            break
        time.sleep(0.1)
    alive = _running_in_group(p.pid)
    if alive:
        os.killpg(p.pid, signal.SIGKILL)
    assert worker not in alive


def test_finished_shards_are_checked_and_never_rewritten(corpus, tmp_path):
    out = tmp_path / "o"
    _prepare(corpus, out, workers=1, part="1/2")
    shard = sorted((out / "shards").glob("*.train.bin"))[0]
    shard.write_bytes(b"\1\0" + shard.read_bytes()[2:])
    with pytest.raises(S.ShardError, match=f"{shard} does not match the sha256"):
        _prepare(corpus, out, workers=1, part="1/2")
    assert shard.read_bytes()[:2] == b"\1\0"
    with pytest.raises(FileExistsError, match="unfinished prepare with other settings"):
        _prepare(corpus, out, workers=1, part="1/2", shard_size=SHARD * 2)


@pytest.mark.parametrize("workers", [1, 2])
def test_full_disk_names_the_shard_and_leaves_no_partial_one(corpus, reference, tmp_path, monkeypatch, capsys,
                                                             workers):
    from hgrn2.cli import main

    real_open = open
    FullDisk.room = 6000

    def fake_open(path, mode="r", *args, **kwargs):
        if "w" in mode and str(path).endswith(".bin.tmp"):
            return FullDisk(path, "w")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(S, "open", fake_open, raising=False)
    out = tmp_path / "o"
    args = ["data", "prepare", str(corpus / "in"), "--tokenizer", str(corpus / "tok"), "--out", str(out),
            "--val-fraction", "0.1", "--shard-size", str(SHARD), "--batch-docs", "7", "--workers", str(workers)]
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("hgrn2 data prepare: error: [Errno 28] no space left on device while writing ")
    named = err.split("while writing ")[1].split(" ")[0]
    assert named.startswith(str(out / "shards")) and named.endswith(".bin")
    names = os.listdir(out / "shards")
    assert not [n for n in names if n.endswith(".tmp")]
    assert all(n.split(".")[0] + ".json" in names for n in names if n.endswith(".bin"))  # no shard without record
    monkeypatch.undo()  # space freed: the same command continues
    assert main(args) == 0
    assert _tree(out / "shards") == _tree(reference[0] / "shards")


def test_json_lines_cut_into_byte_ranges(corpus, tmp_path):
    docs = _docs(300, 5)
    with open(tmp_path / "big.jsonl", "w") as f:
        for i, t in enumerate(docs):
            f.write(json.dumps({"text": t, "meta": {"pile_set_name": "odd" if i % 2 else "even"}}) + "\n")
    metas = [prepare([str(tmp_path / "big.jsonl")], str(tmp_path / f"o{w}"), tokenizer=str(corpus / "tok"),
                     val_fraction=0, shard_size=1000, workers=w, progress=False) for w in (1, 2)]
    assert len(metas[0]["splits"]["train"]["shards"]) > 5 and (tmp_path / "o1" / "meta.json").read_bytes() == (
        tmp_path / "o2" / "meta.json").read_bytes()
    assert metas[0]["splits"]["train"]["by_source"]["odd"]["documents"] == 150
    tok = load_tokenizer(str(corpus / "tok"))
    want = [i for t in docs for i in tok.encode(t, add_special_tokens=False).ids + [metas[0]["eos_id"]]]
    assert read_split(str(tmp_path / "o2"), "train").tolist() == want


def test_latin1_input_is_named(corpus, tmp_path):
    (tmp_path / "l.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"l\.txt: not UTF-8 \(byte 0xe9 at offset 3\)"):
        prepare([str(tmp_path / "l.txt")], str(tmp_path / "o"), tokenizer=str(corpus / "tok"), progress=False)


# ---------------------------------------------------------------------------------------------------------------
# the Pile and SlimPajama


PILE_SETS = ["Pile-CC", "ArXiv", "Github", "Wikipedia (en)"]
SLIM_SETS = ["RedPajamaC4", "RedPajamaArXiv", "RedPajamaGithub"]


def _write_zst(path, records):
    import zstandard

    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(data))


@pytest.fixture(scope="module")
def pile(tmp_path_factory):
    """The Pile's layout: train/00.jsonl.zst, 01.jsonl.zst, val.jsonl.zst of {"text", "meta": {"pile_set_name"}}."""
    d = tmp_path_factory.mktemp("pile")
    rng = random.Random(1)
    docs = {}
    for name, n in (("train/00.jsonl.zst", 120), ("train/01.jsonl.zst", 90), ("val.jsonl.zst", 30)):
        recs = [{"text": t, "meta": {"pile_set_name": rng.choice(PILE_SETS)}} for t in _docs(n, len(docs) + 7)]
        _write_zst(d / name, recs)
        docs[name] = recs
    return d, docs


def test_pile_layout_where_and_per_source_counts(pile, corpus, tmp_path):
    d, docs = pile
    meta = prepare([str(d / "train")], str(tmp_path / "o"), tokenizer=str(corpus / "tok"),
                   val_inputs=[str(d / "val.jsonl.zst")], shard_size=800, workers=2, progress=False)
    train = docs["train/00.jsonl.zst"] + docs["train/01.jsonl.zst"]
    tok = load_tokenizer(str(corpus / "tok"))
    for split, recs in (("train", train), ("val", docs["val.jsonl.zst"])):
        info = meta["splits"][split]
        want = {}
        for r in recs:
            c = want.setdefault(r["meta"]["pile_set_name"], {"tokens": 0, "documents": 0})
            c["tokens"] += len(tok.encode(r["text"], add_special_tokens=False).ids) + 1
            c["documents"] += 1
        assert info["by_source"] == dict(sorted(want.items()))
    assert len(meta["splits"]["train"]["shards"]) > 4  # a compressed file is cut into several shards
    only = prepare([str(d / "train")], str(tmp_path / "w"), tokenizer=str(corpus / "tok"), val_fraction=0,
                   where=["meta.pile_set_name=ArXiv,Github"], progress=False)
    assert sorted(only["splits"]["train"]["by_source"]) == ["ArXiv", "Github"]
    assert only["splits"]["train"]["documents"] == sum(r["meta"]["pile_set_name"] in ("ArXiv", "Github")
                                                        for r in train)
    (d / "train" / "SHA256SUMS.txt").write_text("0123 00.jsonl.zst\n")  # text beside the records: refused
    with pytest.raises(ValueError, match=r"inputs: a mix of text files \(.*SHA256SUMS.txt\) and records"):
        prepare([str(d / "train")], str(tmp_path / "x"), tokenizer=str(corpus / "tok"))
    (d / "train" / "SHA256SUMS.txt").unlink()
    with pytest.raises(ValueError, match="--where: expected FIELD=VALUE"):
        prepare([str(d / "train")], str(tmp_path / "x"), tokenizer=str(corpus / "tok"), where=["ArXiv"])


def test_slimpajama_chunk_folders(corpus, tmp_path):
    root = tmp_path / "SlimPajama-627B"
    recs = {}
    for chunk in (1, 2):
        for k in range(3):
            name = f"train/chunk{chunk}/example_train_{k}.jsonl.zst"
            recs[name] = [{"text": t, "meta": {"redpajama_set_name": SLIM_SETS[(i + k) % 3]}}
                          for i, t in enumerate(_docs(25, chunk * 10 + k))]
            _write_zst(root / name, recs[name])
    _write_zst(root / "validation/chunk1/example_holdout_0.jsonl.zst",
               [{"text": t, "meta": {"redpajama_set_name": "RedPajamaC4"}} for t in _docs(10, 99)])
    meta = prepare([str(root / "train")], str(tmp_path / "o"), tokenizer=str(corpus / "tok"),
                   val_inputs=[str(root / "validation")], workers=2, progress=False)
    tok = load_tokenizer(str(corpus / "tok"))
    order = sorted(recs)  # chunk1/..., chunk2/... : the folders' sorted order is the stream's order
    want = [tok.encode(r["text"], add_special_tokens=False).ids + [meta["eos_id"]] for n in order for r in recs[n]]
    assert read_split(str(tmp_path / "o"), "train").tolist() == [i for ids in want for i in ids]
    assert set(meta["splits"]["train"]["by_source"]) == set(SLIM_SETS)
    assert meta["splits"]["val"]["by_source"]["RedPajamaC4"]["documents"] == 10


# ---------------------------------------------------------------------------------------------------------------
# the loader over shards


def test_loader_over_shards_matches_one_file_in_order_and_across_world_sizes(reference, tmp_path):
    ref, meta = reference
    stream = read_split(str(ref), "train")
    one = tmp_path / "one"
    write_corpus(str(one), {"train": stream, "val": read_split(str(ref), "val")}, meta["vocab_size"])
    sharded, single = PackedDataset(str(ref), "train", 24), PackedDataset(str(one), "train", 24)
    assert len(sharded.files) > 10 and len(sharded) == len(single)
    # windows that cross shard boundaries read the same tokens as the single file
    assert all(torch.equal(sharded[i], single[i]) for i in range(len(single)))
    sampler = StepSampler(len(sharded), 2, 2, 0, 1, seed=3, start_step=0, max_steps=8)
    whole = [x for x in train_loader(sharded, sampler)]
    assert all(torch.equal(a, b) for a, b in zip(whole, train_loader(single, sampler)))
    ranks = [list(train_loader(sharded, StepSampler(len(sharded), 2, 1, r, 2, seed=3, start_step=0, max_steps=8),
                               num_workers=1)) for r in range(2)]
    for s in range(8):  # 2 ranks see the global batch 1 rank sees
        assert torch.equal(torch.cat([whole[2 * s], whole[2 * s + 1]]), torch.cat([ranks[0][s], ranks[1][s]]))
    resumed = list(train_loader(sharded, StepSampler(len(sharded), 2, 2, 0, 1, seed=3, start_step=5, max_steps=8)))
    assert all(torch.equal(a, b) for a, b in zip(resumed, whole[10:]))
    sharded.check_token_range()


def test_old_single_file_datasets_still_load(tmp_path):
    ids = np.arange(1000) % 50
    write_corpus(str(tmp_path), {"train": ids, "val": ids[:100]}, vocab_size=50)
    assert read_meta(str(tmp_path))["format"] == "hgrn2-tokens-v1"
    ds = PackedDataset(str(tmp_path), "train", 10)
    assert ds.file.endswith("train.bin") and torch.equal(ds[7], torch.arange(70, 80) % 50)


def test_the_same_command_after_it_finished_changes_nothing(corpus, tmp_path, capsys):
    """A finished prepare run again with the same command (say, after a kill that came too late) changes no byte and
    says so; other inputs into the same folder are refused in one line."""
    out = tmp_path / "o"
    meta = _prepare(corpus, out, workers=1)
    before = _tree(out)
    assert _prepare(corpus, out, workers=2) == meta
    assert _tree(out) == before and "nothing to do" in capsys.readouterr().out
    with pytest.raises(FileExistsError, match="--overwrite"):
        _prepare(corpus, out, workers=1, val_fraction=0.2)
