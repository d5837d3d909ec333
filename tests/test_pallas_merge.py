"""The split merge (pallas_merge): XLA's jnp and the Pallas kernel (interpret mode here; its GPU
runs are the decode tests of test_mosaic.py, config "merge_kernel") against a float64 oracle
written from the definition, with the edge cases the decode kernels produce: empty splits
(lse = -inf, their partials poisoned), rows no split saw, sinks of -inf and +inf, NaN. The API's
merge of per-source results (adapters.merge_by_lse) shares their weights (lse_merge) and is held
to the same oracle, its sources taking the splits' place."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support.compare import assert_bf16_decode_close
from jax_mla._src import adapters
from jax_mla._src.pallas import merge as pallas_merge


def oracle_merge(parts, part_lse, sink_rows):
  """out[b, r] = sum over the splits that saw anything of exp(lse_s - lse) * parts_s, where
  lse = log(sum_s exp(lse_s) + exp(sink)); float64, row by row."""
  num_seqs, _, num_rows, dim = parts.shape
  out = np.zeros((num_seqs, num_rows, dim))
  lse = np.zeros((num_seqs, num_rows))
  for b in range(num_seqs):
    for r in range(num_rows):
      ls = part_lse[b, :, r].astype(np.float64)
      seen = ls != -np.inf
      terms = list(ls[seen]) + ([float(sink_rows[r])] if sink_rows[r] != -np.inf else [])
      if np.isnan(ls).any():
        out[b, r], lse[b, r] = np.nan, np.nan
      elif sink_rows[r] == np.inf:
        lse[b, r] = np.inf
      elif not terms:
        lse[b, r] = -np.inf
      else:
        m = max(terms)
        lse[b, r] = m + np.log(np.sum(np.exp(np.array(terms) - m)))
        out[b, r] = np.einsum("s,sd->d", np.exp(ls[seen] - lse[b, r]),
                              parts[b, seen, r].astype(np.float64))
  return out, lse


def make_partials(rng, num_seqs, num_splits, num_rows, *, nan_row=None):
  parts = rng.standard_normal((num_seqs, num_splits, num_rows, 512)).astype(np.float32)
  part_lse = (rng.standard_normal((num_seqs, num_splits, num_rows)) * 4).astype(np.float32)
  # Empty splits: some, all of one row's, and the first of several rows; their partials hold
  # NaN, which must never reach the result.
  empty = rng.random(part_lse.shape) < 0.3
  empty[:, :, 1] = True
  empty[:, 0, 4:8] = True
  part_lse[empty] = -np.inf
  parts[empty] = np.nan
  sink = rng.standard_normal(num_rows).astype(np.float32)
  sink[1:3] = -np.inf  # row 1: nothing seen and no sink
  sink[5] = np.inf
  if nan_row is not None:
    part_lse[:, -1, nan_row] = np.nan
  return parts, part_lse, sink


MERGES = {
    "xla": jax.jit(pallas_merge.merge_partials),
    "kernel": jax.jit(functools.partial(pallas_merge.merge_kernel, interpret=True)),
}


@pytest.mark.parametrize("merge", list(MERGES))
@pytest.mark.parametrize("num_seqs,num_splits,num_rows", [
    (1, 2, 16), (2, 3, 32), (1, 5, 64), (2, 32, 16), (1, 33, 16)])
def test_matches_the_oracle(merge, num_seqs, num_splits, num_rows):
  rng = np.random.default_rng(num_splits * 100 + num_rows)
  parts, part_lse, sink = make_partials(rng, num_seqs, num_splits, num_rows)
  out, lse = MERGES[merge](parts, part_lse, sink)
  assert out.dtype == jnp.bfloat16 and lse.dtype == jnp.float32
  assert out.shape == (num_seqs, num_rows, 512) and lse.shape == (num_seqs, num_rows)
  want_out, want_lse = oracle_merge(parts, part_lse, sink)
  assert np.isfinite(want_out).all()  # the poisoned partials must not reach the result
  assert_bf16_decode_close(np.asarray(out, np.float32), np.asarray(lse), want_out, want_lse)


@pytest.mark.parametrize("merge", list(MERGES))
def test_a_nan_lse_makes_its_row_nan_and_no_other(merge):
  rng = np.random.default_rng(7)
  parts, part_lse, sink = make_partials(rng, 2, 4, 16, nan_row=9)
  out, lse = (np.asarray(x, np.float32) for x in MERGES[merge](parts, part_lse, sink))
  want_out, want_lse = oracle_merge(parts, part_lse, sink)
  assert np.isnan(out[:, 9]).all() and np.isnan(lse[:, 9]).all()
  assert_bf16_decode_close(out, lse, want_out, want_lse)


def merge_sources(parts, part_lse, sink):
  """adapters.merge_by_lse on the partials as per-source results: sequences as query tokens,
  rows as heads, splits as sources (bf16 outs, as decodes return them)."""
  results = [(jnp.asarray(parts[:, s], jnp.bfloat16), jnp.asarray(part_lse[:, s]))
             for s in range(parts.shape[1])]
  return jax.jit(adapters.merge_by_lse)(results, jnp.asarray(sink))


@pytest.mark.parametrize("num_sources,nan_row", [(2, None), (3, None), (2, 9)])
def test_the_apis_source_merge_matches_the_oracle(num_sources, nan_row):
  rng = np.random.default_rng(num_sources)
  parts, part_lse, sink = make_partials(rng, 2, num_sources, 16, nan_row=nan_row)
  parts = np.asarray(jnp.asarray(parts, jnp.bfloat16), np.float32)  # what a decode returns
  out, lse = merge_sources(parts, part_lse, sink)
  assert out.dtype == jnp.bfloat16 and lse.dtype == jnp.float32
  want_out, want_lse = oracle_merge(parts, part_lse, sink)
  if nan_row is None:
    assert np.isfinite(want_out).all()  # the poisoned outs must not reach the result
  assert_bf16_decode_close(np.asarray(out, np.float32), np.asarray(lse), want_out, want_lse)


def test_the_kernel_and_xla_agree_to_a_bf16_rounding():
  rng = np.random.default_rng(11)
  parts, part_lse, sink = make_partials(rng, 2, 6, 48)
  a, b = MERGES["kernel"](parts, part_lse, sink), MERGES["xla"](parts, part_lse, sink)
  np.testing.assert_array_equal(np.asarray(a[1]), np.asarray(b[1]))
  diff = np.abs(np.asarray(a[0], np.float32) - np.asarray(b[0], np.float32))
  assert (diff <= 2.0**-8 * np.abs(np.asarray(b[0], np.float32)) + 1e-6).all()


MAX_ROWS = pallas_merge.KERNEL_MERGE_MAX_ROWS


@pytest.mark.parametrize("num_seqs,num_splits,row_slots,tokens,num_heads,kernel", [
    (1, 1, 128, 1, 128, False),  # nothing to merge
    (MAX_ROWS // 512 + 1, 31, 512, 1, 512, False),  # too many rows ...
    (MAX_ROWS // 512 + 1, 32, 512, 1, 512, True), (1, 64, 16, 1, 16, True),  # ... but 32 splits
    (MAX_ROWS // 128, 2, 128, 1, 128, True),  # at most MAX_ROWS rows, then more
    (MAX_ROWS // 128 + 1, 2, 128, 1, 128, False),
    (MAX_ROWS // 64, 2, 64, 4, 16, True),  # four tokens per sequence: the same
    (MAX_ROWS // 64 + 1, 2, 64, 4, 16, False),
    (MAX_ROWS // 32, 2, 64, 1, 32, True),  # padding rows: only the real ones count
    (MAX_ROWS // 32 + 1, 2, 64, 1, 32, False),
    (1, 2, 64, 1, 40, False),  # 40 rows: not the kernel's multiple of 16
])
def test_auto_takes_the_kernel_from_32_splits_or_for_few_rows(num_seqs, num_splits, row_slots,
                                                              tokens, num_heads, kernel):
  rows = tokens * num_heads
  results = (jax.ShapeDtypeStruct((num_seqs, num_splits, row_slots, 512), jnp.float32),
             jax.ShapeDtypeStruct((num_seqs, num_splits, row_slots), jnp.float32))
  if num_splits == 1:
    results = (jax.ShapeDtypeStruct((num_seqs, row_slots, 512), jnp.bfloat16),
               jax.ShapeDtypeStruct((num_seqs, row_slots), jnp.float32))
  finish = functools.partial(pallas_merge.finish, num_splits=num_splits, rows=rows,
                             num_tokens=num_seqs * tokens, num_heads=num_heads, merge="auto",
                             interpret=True)
  jaxpr = str(jax.make_jaxpr(lambda r, s: finish(r, sink=s))(
      results, jax.ShapeDtypeStruct((num_heads,), jnp.float32)))
  assert ("pallas_call" in jaxpr) == kernel


def test_bad_arguments_raise():
  parts = jnp.zeros((1, 2, 16, 512), jnp.float32)
  lse = jnp.zeros((1, 2, 16), jnp.float32)
  with pytest.raises(ValueError, match=r"merge must be one of \('auto', 'xla', 'kernel'\)"):
    pallas_merge.finish((parts, lse), 2, jnp.zeros(16), rows=16, num_tokens=1, num_heads=16,
                        merge="fused")
  with pytest.raises(ValueError, match="rows a multiple of 16"):
    pallas_merge.merge_kernel(parts[:, :, :8], lse[:, :, :8], jnp.zeros(8), interpret=True)
  with pytest.raises(ValueError, match="rows a multiple of 16, at most the partials'"):
    pallas_merge.merge_kernel(parts, lse, jnp.zeros(16), rows=32, heads=16, interpret=True)
  with pytest.raises(ValueError, match=r"a sink per head, \[4\], got \(16,\)"):
    pallas_merge.merge_kernel(parts, lse, jnp.zeros(16), heads=4, interpret=True)


def finish_both(results, sink, **layout):
  """pallas_merge.finish by the kernel (interpret mode) and by XLA, on the same results."""
  return [pallas_merge.finish(results, results[0].shape[1], jnp.asarray(sink), merge=merge,
                              interpret=True, **layout) for merge in ("kernel", "xla")]


@pytest.mark.parametrize("tokens,num_heads,row_slots", [
    (4, 16, 64),  # several tokens a sequence: row r takes head r % 16's sink
    (1, 32, 64),  # padding rows (poisoned): dropped, never merged
    (2, 16, 64),  # both
])
def test_the_kernel_lays_out_rows_by_head_and_drops_padding(tokens, num_heads, row_slots):
  rng = np.random.default_rng(tokens * 1000 + num_heads)
  num_seqs, rows = 2, tokens * num_heads
  parts, part_lse, _ = make_partials(rng, num_seqs, 3, row_slots)
  parts[:, :, rows:] = np.nan  # padding rows: nothing of them may reach the result
  part_lse[:, :, rows:] = np.nan
  sink = rng.standard_normal(num_heads).astype(np.float32)
  sink[3] = -np.inf
  sink_rows = np.tile(sink, tokens)  # the oracle's sink by row, from the definition
  want_out, want_lse = oracle_merge(parts[:, :, :rows], part_lse[:, :, :rows], sink_rows)
  assert np.isfinite(want_out).all()
  merged = pallas_merge.merge_kernel(parts, part_lse, sink, rows=rows, heads=num_heads,
                                     interpret=True)
  assert [x.shape for x in merged] == [(num_seqs, rows, 512), (num_seqs, rows)]
  layout = dict(rows=rows, num_tokens=num_seqs * tokens, num_heads=num_heads)
  for out, lse in finish_both((parts, part_lse), sink, **layout):
    assert out.shape == (num_seqs * tokens, num_heads, 512)
    assert lse.shape == (num_seqs * tokens, num_heads)
    assert_bf16_decode_close(np.asarray(out, np.float32).reshape(num_seqs, rows, 512),
                             np.asarray(lse).reshape(num_seqs, rows), want_out, want_lse)
