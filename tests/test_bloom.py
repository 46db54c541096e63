"""Bloom filter: sizing, measured false-positive rate, C++/numpy identity, policies."""
import math

import numpy as np
import pytest
from pybloom_live import BloomFilter

import deepreduce_hvd as dr
from deepreduce_hvd.codecs import bloom_filter
from deepreduce_hvd.engine import native


@pytest.mark.parametrize("count,size", [(100, 10_000), (1_000, 100_000), (10_000, 1_000_000)])
def test_measured_fpr_matches_theory(count, size, rng):
    m, h = bloom_filter.parameters(count, size)
    inserted = np.sort(rng.choice(size, count, replace=False))
    filt = bloom_filter.insert(inserted, m, h, seed=5)
    positives = bloom_filter.query(filt, m, h, 5, size)
    assert np.isin(inserted, positives).all()  # no false negatives, ever
    false = positives.size - count
    theory = (1 - math.exp(-h * count / m)) ** h
    expected = theory * (size - count)
    # binomial: within 5 standard deviations (plus slack for tiny counts)
    assert abs(false - expected) <= 5 * math.sqrt(expected) + 3, (false, expected)
    # the default target 0.1 * count / size is met (theory rounds m and h up)
    assert theory <= 0.1 * count / size * 1.05


@pytest.mark.parametrize("count,fpr", [(1000, 0.01), (50_000, 0.001), (10, 0.1)])
def test_sizing_agrees_with_pybloom_live(count, fpr):
    m, h = bloom_filter.parameters(count, 10**9, fpr)
    reference = BloomFilter(capacity=count, error_rate=fpr)
    assert h == reference.num_slices
    assert abs(m - reference.num_bits) <= reference.num_slices


@pytest.mark.skipif(native.engine is None, reason="C++ op not built")
@pytest.mark.parametrize("count,size,seed", [(1, 1, 0), (500, 70_000, 3), (20_000, 2_000_000, 2**63)])
def test_native_and_numpy_bit_identical(count, size, seed, rng):
    m, h = bloom_filter.parameters(count, size)
    inserted = np.sort(rng.choice(size, count, replace=False))
    native_filter = bloom_filter.insert(inserted, m, h, seed)
    assert native_filter == bloom_filter.insert_numpy(inserted, m, h, seed)
    np.testing.assert_array_equal(bloom_filter.query(native_filter, m, h, seed, size),
                                  bloom_filter.query_numpy(native_filter, m, h, seed, size))


@pytest.mark.parametrize("policy", ["random", "conflict", "leftmost"])
def test_lossy_policies_send_true_values_at_chosen_positions(policy, rng):
    dense = rng.standard_normal(200_000).astype(np.float32)
    values, indices = dr.topk(dense, 0.01)
    codec = dr.SparseCodec(index={"id": "bloom", "policy": policy})
    assert not codec.lossless
    v2, i2, _ = dr.decode(codec.encode(values, indices, dense.shape, dense=dense))
    assert i2.size == indices.size
    np.testing.assert_array_equal(v2, dense[i2])
    assert np.isin(i2, indices).mean() > 0.85


def test_conflict_policy_prefers_certain_positives(rng):
    size = 100_000
    indices = np.sort(rng.choice(size, 1000, replace=False))
    m, h = bloom_filter.parameters(indices.size, size, fpr=0.02)
    filt = bloom_filter.insert(indices, m, h, 0)
    positives = bloom_filter.query(filt, m, h, 0, size)
    sizes = dr.codecs.index.bloom.smallest_conflict_set(positives, m, h, 0)
    singletons = positives[sizes == 1]
    assert singletons.size > 0 and np.isin(singletons, indices).all()
    from deepreduce_hvd.codecs.index.bloom import select
    chosen = select("conflict", positives, indices.size, filt, m, h, 0)
    chosen_random = select("random", positives, indices.size, filt, m, h, 0)
    assert np.isin(singletons, chosen).all()
    assert np.isin(chosen, indices).sum() >= np.isin(chosen_random, indices).sum()


def test_p0_false_positives_carry_dense_values(rng):
    dense = rng.standard_normal(100_000).astype(np.float32)
    values, indices = dr.topk(dense, 0.01)
    v2, i2, _ = dr.decode(dr.SparseCodec(index="bloom").encode(values, indices, dense.shape,
                                                              dense=dense))
    assert i2.size > indices.size  # some false positives at the default rate
    assert np.isin(indices, i2).all()
    np.testing.assert_array_equal(v2, dense[i2])
