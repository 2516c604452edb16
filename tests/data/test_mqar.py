"""MQAR generator: invariants, determinism, caching, and bit-for-bit equality with zoology's algorithm."""

import numpy as np
import pytest

from hgrn2.data import mqar


def zoology_multiquery_ar(vocab_size, num_examples, input_seq_len, seed, power_a=0.01, num_kv_pairs=8):
    """Oracle: a direct transcription of zoology's `multiquery_ar` (HazyResearch/zoology,
    zoology/data/multiquery_ar.py; num_passes=1, random_non_queries=False) returning numpy arrays."""
    assert input_seq_len % 2 == 0
    assert vocab_size > input_seq_len
    assert num_kv_pairs * 4 <= input_seq_len
    np.random.seed(seed)
    context_size = num_kv_pairs * 2
    key_vocab_size = vocab_size // 2
    key_choices = np.arange(1, key_vocab_size)
    value_choices = np.arange(key_vocab_size, vocab_size)
    keys_unshuffled = np.tile(key_choices, (num_examples, 1))
    keys = np.apply_along_axis(np.random.choice, 1, keys_unshuffled, replace=False, size=num_kv_pairs)
    values_unshuffled = np.tile(value_choices, (num_examples, 1))
    values = np.apply_along_axis(np.random.choice, 1, values_unshuffled, replace=False, size=num_kv_pairs)
    kvs = np.zeros((num_examples, context_size), dtype=np.int64)
    kvs[:, 0::2] = keys
    kvs[:, 1::2] = values
    space = (input_seq_len - context_size) // 2
    p = power_a * np.arange(1, space + 1) ** (power_a - 1)
    p = p / p.sum()
    x = np.stack([np.arange(space, dtype=int)] * num_examples)
    gaps = np.apply_along_axis(np.random.choice, axis=1, arr=x, replace=False, p=p, size=num_kv_pairs)
    queries = np.zeros((num_examples, input_seq_len - context_size + 1), dtype=np.int64)
    np.put_along_axis(queries, (gaps * 2), values=keys, axis=1)
    examples = np.concatenate([kvs, queries], axis=1)
    labels = np.full((num_examples, input_seq_len + 1), -100, dtype=np.int64)
    np.put_along_axis(labels, (gaps * 2) + context_size + 1, values=values, axis=1)
    return examples[:, :-1], labels[:, 1:]


def zoology_seeds(seed=123):
    """Oracle: zoology's prepare_data seed derivation for one train and one test segment."""
    max_seed = 2**32
    np.random.seed(seed)
    train_seeds = np.random.randint(0, max_seed // 2, size=1)
    test_seeds = np.random.randint(max_seed // 2, max_seed, size=1)
    return int(train_seeds[0]), int(test_seeds[0])


@pytest.fixture(autouse=True)
def _keep_global_numpy_state():
    state = np.random.get_state()
    yield
    np.random.set_state(state)


@pytest.mark.parametrize(
    "n,seq_len,kv,vocab,seed",
    [(37, 64, 4, 8192, 0), (23, 128, 8, 8192, 7), (11, 256, 16, 8192, 843828734), (9, 512, 64, 8192, 3062119789),
     (50, 16, 2, 32, 5), (40, 32, 8, 64, 11)],
)
def test_equals_zoology(n, seq_len, kv, vocab, seed):
    ref_x, ref_y = zoology_multiquery_ar(vocab, n, seq_len, seed, num_kv_pairs=kv)
    x, y = mqar.multiquery_ar(n, seq_len, kv, seed, vocab_size=vocab)
    assert x.dtype == ref_x.dtype == np.int64 and y.dtype == np.int64
    np.testing.assert_array_equal(x, ref_x)
    np.testing.assert_array_equal(y, ref_y)


@pytest.mark.parametrize("data_seed", [123, 0, 2024])
def test_seeds_equal_zoology(data_seed):
    assert mqar.split_seeds(data_seed) == zoology_seeds(data_seed)
    train, test = mqar.split_seeds(data_seed)
    assert 0 <= train < 2**31 <= test < 2**32


@pytest.mark.parametrize("seq_len,kv", mqar.SETTINGS)
def test_invariants(seq_len, kv):
    n = 64
    d = mqar.draw(n, seq_len, kv, seed=1)
    x, y = d.arrays()
    half = mqar.VOCAB_SIZE // 2
    assert x.shape == y.shape == (n, seq_len)
    # context: keys on even, values on odd positions; keys from 1..V/2-1, values from V/2..V-1, distinct per row
    keys, values = x[:, 0 : 2 * kv : 2], x[:, 1 : 2 * kv : 2]
    assert ((keys >= 1) & (keys < half)).all() and ((values >= half) & (values < mqar.VOCAB_SIZE)).all()
    assert all(len(set(r)) == kv for r in keys) and all(len(set(r)) == kv for r in values)
    # after the context: only filler 0 and query keys; each key queried exactly once, on an even offset
    rest = x[:, 2 * kv :]
    q = rest != 0
    assert (q.sum(1) == kv).all() and not q[:, 1::2].any()
    for r in range(n):
        assert sorted(rest[r][q[r]]) == sorted(keys[r])
    # labels: -100 everywhere except at the query positions, where they are the queried key's value
    sup = y != -100
    assert (sup[:, : 2 * kv] == 0).all() and (sup[:, 2 * kv :] == q).all()
    lookup = [dict(zip(k, v)) for k, v in zip(keys, values)]
    for r in range(n):
        pos = np.flatnonzero(sup[r])
        assert [lookup[r][t] for t in x[r, pos]] == list(y[r, pos])
    np.testing.assert_array_equal(np.sort(d.positions, 1), np.stack([np.flatnonzero(s) for s in sup]))


def test_power_law_prefers_near_slots():
    d = mqar.draw(400, 256, 16, seed=3)
    space = (256 - 32) // 2
    counts = np.bincount(d.slots.ravel(), minlength=space)
    assert counts[: space // 4].sum() > counts[-space // 4 :].sum()


def test_deterministic_and_seed_dependent():
    a = mqar.multiquery_ar(20, 64, 4, seed=9)
    b = mqar.multiquery_ar(20, 64, 4, seed=9)
    c = mqar.multiquery_ar(20, 64, 4, seed=10)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])


def test_load_caches(tmp_path):
    d1 = mqar.load("test", 64, 4, num_examples=30, cache_dir=tmp_path)
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1
    d2 = mqar.load("test", 64, 4, num_examples=30, cache_dir=tmp_path)
    ref = mqar.multiquery_ar(30, 64, 4, seed=mqar.split_seeds()[1])
    for d in (d1, d2):
        np.testing.assert_array_equal(d.arrays()[0], ref[0])
        np.testing.assert_array_equal(d.arrays()[1], ref[1])
    mqar.load("train", 64, 4, num_examples=30, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.npz"))) == 2


@pytest.mark.parametrize(
    "kwargs,match",
    [(dict(num_examples=0, seq_len=64, num_kv_pairs=4), "num_examples"),
     (dict(num_examples=2, seq_len=63, num_kv_pairs=4), "seq_len"),
     (dict(num_examples=2, seq_len=64, num_kv_pairs=17), "num_kv_pairs"),
     (dict(num_examples=2, seq_len=64, num_kv_pairs=4, vocab_size=64), "vocab_size")],
)
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mqar.draw(seed=0, **kwargs)
    with pytest.raises(ValueError, match="split"):
        mqar.load("valid", 64, 4)
