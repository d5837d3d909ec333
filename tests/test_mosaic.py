"""The Mosaic GPU kernel (NVIDIA Hopper) against the float64 oracle, and its lowering on the CPU.

The kernel uses TMA, mbarriers and wgmma, which have no interpret mode: the oracle tests run on
an sm90 GPU only (marked `gpu`; skipped with the reason elsewhere). What the CPU checks in CI is
that the kernel lowers for CUDA (shapes, layouts, shared-memory budget, barriers) for every
shape family the tests use.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support.compare import assert_bf16_decode_close
from support.gpu_export import export_for
from jax_mla._src.pallas.mosaic import decode as md
from support.oracle import oracle_decode
from support.rows import make_batch


def _hopper():
  try:
    dev = jax.devices()[0]
  except RuntimeError:
    return False
  return dev.platform == "gpu" and str(getattr(dev, "compute_capability", "")) == "9.0"


GPU = pytest.mark.skipif(not _hopper(), reason=f"needs an sm90 (Hopper) GPU; the default "
                         f"backend is {jax.default_backend()!r}")
@functools.lru_cache(maxsize=None)
def decoder(tokens_per_seq=1, num_kv_splits=None, return_lse=True):
  return jax.jit(functools.partial(md.mosaic_decode, tokens_per_seq=tokens_per_seq,
                                   num_kv_splits_=num_kv_splits, return_lse=return_lse))


def run(batch, num_kv_splits=None, return_lse=True):
  args = [*batch.args()[:-1], batch.sink_array()]
  out, lse = decoder(batch.tokens_per_seq, num_kv_splits, return_lse)(*args)
  return np.asarray(jnp.asarray(out, jnp.float32)), (None if lse is None else np.asarray(lse))


def abstract_args(batch):
  """The batch's decode arguments as shapes and dtypes, for lowering without running."""
  return [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in batch.args()]


def check_against_oracle(batch, out, lse):
  assert_bf16_decode_close(out, lse, *oracle_decode(*batch.args(), batch.tokens_per_seq))


# (heads, tokens, lengths, splits): 128 heads pair their CTAs, 64 and 16 x 4 do not; 40 splits
# take the merge kernel (pallas.merge.KERNEL_MERGE_MIN_SPLITS), 3 XLA's merge, 1 none.
SHAPES = [(16, 4, [5, 0, 150, 1], 1), (64, 1, [300, 2], 3), (128, 1, [5, 0, 150, 1], None),
          (128, 1, [300, 0, 2500], 40)]


@pytest.mark.parametrize("num_heads,tokens_per_seq,lengths,splits", SHAPES)
def test_lowers_for_cuda_on_any_machine(num_heads, tokens_per_seq, lengths, splits):
  args = abstract_args(make_batch(np.random.default_rng(1), num_heads=num_heads,
                                  tokens_per_seq=tokens_per_seq, lengths=lengths, sink=0.3))
  fn = functools.partial(md.mosaic_decode, tokens_per_seq=tokens_per_seq, num_kv_splits_=splits)
  module = export_for(fn, "cuda", *args,
                      custom_calls=["mosaic_gpu_v2", "__gpu$xla.gpu.triton"]).mlir_module()
  assert "mosaic_gpu" in module
  assert ("jax_mla_merge_partials" in module) == (splits == 40)


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("num_heads,tokens_per_seq,lengths,splits", SHAPES)
def test_matches_the_oracle(num_heads, tokens_per_seq, lengths, splits):
  rng = np.random.default_rng(num_heads * 10 + tokens_per_seq)
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq, lengths=lengths,
                     pool_rows=4096, sink=0.3, extra_indices=7)
  out, lse = run(batch, num_kv_splits=splits)
  check_against_oracle(batch, out, lse)


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("pattern", ["random", "same", "last"])
@pytest.mark.parametrize("num_heads", [64, 128])
def test_repeated_and_unsorted_indices(pattern, num_heads):
  rng = np.random.default_rng(len(pattern))
  batch = make_batch(rng, num_heads=num_heads, lengths=[70, 3, 129], sink=0.1,
                     index_pattern=pattern)
  out, lse = run(batch, num_kv_splits=2)
  check_against_oracle(batch, out, lse)


def test_direct_register_split_fits_the_launch():
  """An increase past what the other warpgroups released waits forever (it hung on the H200
  with 200 + 160 + 152): the split sums to no more than the launch's registers."""
  from jax_mla._src.pallas.mosaic import consumer as mosaic_consumer  # pylint: disable=import-outside-toplevel
  from jax_mla._src.pallas.mosaic import kernel as mosaic_direct  # pylint: disable=import-outside-toplevel
  split = mosaic_direct.REGISTERS
  assert sorted(split) == [0, 1, 2]
  assert sum(split.values()) <= mosaic_consumer.LAUNCH_REGISTERS
  assert all(r % 8 == 0 and 24 <= r <= 256 for r in split.values())
