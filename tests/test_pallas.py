"""The Pallas backend against the float64 oracle, and its contracts.

Every test runs twice: in Pallas interpret mode (any machine; the CPU in CI) and compiled through
Triton on a GPU (marked `gpu`; skipped with the reason when the default backend is no GPU).
Interpret mode runs the same kernel body (gathers, fp8/e8m0 decoding, online softmax, split
merge) as jnp ops; what it cannot check is the Triton compilation itself (layouts, MMA, masked
memory access), which the `gpu` copies of the tests cover.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support.compare import assert_bf16_decode_close, assert_close
from support.gpu_export import export_for
from jax_mla._src.pallas import triton as pd
from support.oracle import oracle_decode
from support.rows import make_batch, poison_padding

SINKS = {"none": None, "neg_inf": -np.inf, "finite": 0.75, "large": 60.0, "pos_inf": np.inf}
ON_GPU = jax.default_backend() in ("gpu", "cuda", "rocm")
MODES = [
    pytest.param("interpret", id="interpret"),
    pytest.param("gpu", id="gpu", marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not ON_GPU, reason=f"needs a CUDA or ROCm GPU; the default backend "
                           f"is {jax.default_backend()!r}")]),
]


@functools.lru_cache(maxsize=None)
def decoder(mode, tokens_per_seq=1, num_kv_splits=None, return_lse=True):
  """A jitted decode: interpret mode compiles once per shape, so repeated shapes are fast."""
  return jax.jit(functools.partial(
      pd.pallas_decode, tokens_per_seq=tokens_per_seq, num_kv_splits=num_kv_splits,
      return_lse=return_lse, interpret=(mode == "interpret")))


def run(mode, batch, num_kv_splits=None, return_lse=True):
  args = [*batch.args()[:-1], batch.sink_array()]
  out, lse = decoder(mode, batch.tokens_per_seq, num_kv_splits, return_lse)(*args)
  return np.asarray(jnp.asarray(out, jnp.float32)), (None if lse is None else np.asarray(lse))


def check_against_oracle(batch, out, lse):
  assert_bf16_decode_close(out, lse, *oracle_decode(*batch.args(), batch.tokens_per_seq))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_heads,tokens_per_seq", [(16, 1), (16, 4), (64, 1), (128, 1)])
@pytest.mark.parametrize("splits", [1, None], ids=["one_split", "planned"])
def test_matches_oracle_over_heads_and_tokens(mode, num_heads, tokens_per_seq, splits):
  rng = np.random.default_rng(num_heads * 10 + tokens_per_seq)
  # Ragged: an empty row, rows shorter than a KV block, one over two blocks.
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                     lengths=[5, 0, 150, 1], sink=0.3, extra_indices=7)
  out, lse = run(mode, batch, num_kv_splits=splits)
  check_against_oracle(batch, out, lse)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pattern", ["random", "unique", "reversed", "same", "last"])
def test_repeated_and_unsorted_indices(mode, pattern):
  rng = np.random.default_rng(len(pattern))
  batch = make_batch(rng, num_heads=16, lengths=[70, 3, 129], sink=0.1, index_pattern=pattern)
  out, lse = run(mode, batch, num_kv_splits=2)
  check_against_oracle(batch, out, lse)


@pytest.mark.parametrize("mode", MODES)
def test_return_lse_false(mode):
  """(The persistent API on this kernel: tests/test_pallas_backend.py.)"""
  batch = make_batch(np.random.default_rng(10), num_heads=128, lengths=[3, 0], sink=0.4)
  out, lse = run(mode, batch, return_lse=False)
  assert lse is None and out.shape == (2, 128, 512)
  check_against_oracle(batch, out, run(mode, batch)[1])


def test_split_plan_is_static_and_bounded():
  from jax_mla._src.pallas import plan as pallas_plan  # pylint: disable=import-outside-toplevel
  assert pallas_plan.num_kv_splits(1, 2, 2048, 64) > 1  # few programs: split the KV
  assert pallas_plan.num_kv_splits(128, 2, 128 * 2048, 64) == 1  # the grid is full already
  assert pallas_plan.num_kv_splits(4, 1, 4 * 100, 64) == 1  # rows too short to be worth it
  assert pallas_plan.num_kv_splits(1, 1, 0, 64) == 1


def test_waves_split_rule_avoids_a_part_empty_second_wave(monkeypatch):
  from jax_mla._src.pallas import plan as pallas_plan  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(pallas_plan, "num_sms", lambda: 132)
  plan = lambda seqs, blocks, length, rule: pallas_plan.num_kv_splits(
      seqs, blocks, seqs * length, 64, min_entries=64, rule=rule)
  # 64 programs: 3 splits are 192 CTAs, two waves of 3 blocks; 2 are one wave of 4.
  assert (plan(64, 1, 512, "fill"), plan(64, 1, 512, "waves")) == (3, 2)
  # 128 programs: 2 splits are two waves of 16 blocks, 1 is one wave of 32: the same path.
  assert (plan(64, 2, 2048, "fill"), plan(64, 2, 2048, "waves")) == (2, 1)
  # Few programs: both split as far as the rows allow (32 splits of one block).
  assert plan(1, 2, 2048, "fill") == plan(1, 2, 2048, "waves") == 32
  # 16 programs: "fill" makes 9 splits of 4 blocks (32 / 9 rounded up); 8 of 4 is as short.
  assert (plan(8, 2, 2048, "fill"), plan(8, 2, 2048, "waves")) == (9, 8)
  with pytest.raises(ValueError, match="split rule must be one of"):
    plan(1, 1, 512, "even")


@pytest.mark.parametrize("platform", ["rocm", "cuda"])
def test_triton_lowering_exports_from_the_cpu(platform):
  """The kernel lowers for ROCm (and CUDA) without a GPU: `jax.export` to that platform gives one
  Triton custom call with the planned grid. The Triton IR inside is compiled only on a device, so
  this checks the Pallas -> Triton lowering, not the Triton -> AMDGPU compilation. The target has
  no export compatibility guarantee, hence the disabled check."""
  batch = make_batch(np.random.default_rng(13), num_heads=128, lengths=[5, 7, 0], sink=0.1)
  shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in batch.args()]
  f = functools.partial(pd.pallas_decode, tokens_per_seq=1, num_kv_splits=2)
  exported = export_for(f, platform, *shapes, custom_calls=["__gpu$xla.gpu.triton"])
  text = exported.mlir_module()
  calls = [line for line in text.splitlines() if "__gpu$xla.gpu.triton" in line]
  assert len(calls) == 1, calls
  # grid = (sequences, row blocks of 64, splits)
  assert "grid_x = 3 : i32, grid_y = 2 : i32, grid_z = 2 : i32" in calls[0]


@pytest.mark.parametrize("mode", MODES)
def test_out_of_range_indices_are_clamped_like_the_reference(mode):
  """Index values are device data nobody checks: the kernel clamps them into the pool (as the
  reference does) instead of reading outside it."""
  import jax_mla  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(14)
  batch = make_batch(rng, num_heads=16, lengths=[6, 5], pool_rows=64, sink=0.2)
  batch.kv_indices[1] = 64 + 5
  batch.kv_indices[7] = -3
  out, lse = run(mode, batch)
  want_out, want_lse = jax_mla.decode(*batch.args(), backend="reference")
  want_out = np.asarray(jnp.asarray(want_out, jnp.float32))
  scale = np.abs(want_out).max()
  assert_close("out", out, want_out, atol=scale * 2.0**-7, rtol=2.0**-8)
  assert_close("lse", lse, np.asarray(want_lse), atol=1e-4, rtol=1e-5, cos_tol=None)


@pytest.mark.parametrize("mode", MODES)
def test_smaller_kv_blocks_match_the_oracle(mode):
  """A non-default block size (KernelConfig's tuning surface for GPUs not yet measured) computes
  the same function, with poisoned padding, an empty row, a short row and a split merge."""
  rng = np.random.default_rng(15)
  batch = make_batch(rng, num_heads=64, lengths=[5, 0, 150], sink=0.3, extra_indices=5)
  batch.q = poison_padding(batch.q, "ff")
  batch.kv = poison_padding(batch.kv, "random", rng)
  for splits in (1, 2):
    out, lse = pd.pallas_decode(*[jnp.asarray(a) for a in batch.args()], tokens_per_seq=1,
                                num_kv_splits=splits, interpret=(mode == "interpret"),
                                config=pd.KernelConfig(block_rows=32, block_kv=32))
    check_against_oracle(batch, np.asarray(jnp.asarray(out, jnp.float32)), np.asarray(lse))
