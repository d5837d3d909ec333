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
SINKS = {"none": None, "neg_inf": -np.inf, "finite": 0.75, "large": 60.0, "pos_inf": np.inf}


# The kernel's variants (see MosaicConfig). The first is the default.
UNPAIRED = dict(pair_row_blocks=False)
CONFIGS = {
    # paired CTAs, inputs read in the kernel
    "default": md.MosaicConfig(),
    "unpaired": md.MosaicConfig(**UNPAIRED),
    "fill_split_rule": md.MosaicConfig(split_rule="fill"),
    "exact_math": md.MosaicConfig(approx_math=False),
    "xla_inputs": md.MosaicConfig(inputs_in_kernel=False),
    "merge_kernel": md.MosaicConfig(merge="kernel"),
    "merge_xla": md.MosaicConfig(merge="xla"),
}
# Each path of the kernel runs the contract tests below (sinks, indices, poison, NaN, empty
# rows): at 128 heads where its CTAs are paired (two row blocks), else at 64.
DESIGNS = {"direct": "default", "direct_unpaired": "unpaired", "direct_xla_inputs": "xla_inputs",
           "direct_merge_kernel": "merge_kernel"}


def heads(design):
  config = CONFIGS[DESIGNS[design]]
  return 128 if config.pair_row_blocks is not False else 64


@functools.lru_cache(maxsize=None)
def decoder(tokens_per_seq=1, num_kv_splits=None, return_lse=True, config="default"):
  return jax.jit(functools.partial(md.mosaic_decode, tokens_per_seq=tokens_per_seq,
                                   num_kv_splits_=num_kv_splits, return_lse=return_lse,
                                   config=CONFIGS[config]))


def run(batch, num_kv_splits=None, return_lse=True, config="default"):
  args = [*batch.args()[:-1], batch.sink_array()]
  out, lse = decoder(batch.tokens_per_seq, num_kv_splits, return_lse, config)(*args)
  return np.asarray(jnp.asarray(out, jnp.float32)), (None if lse is None else np.asarray(lse))


def abstract_args(batch):
  """The batch's decode arguments as shapes and dtypes, for lowering without running."""
  return [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in batch.args()]


def check_against_oracle(batch, out, lse):
  assert_bf16_decode_close(out, lse, *oracle_decode(*batch.args(), batch.tokens_per_seq))


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("num_heads,tokens_per_seq,lengths,splits", [
    (16, 4, [5, 0, 150, 1], 1), (64, 1, [300, 2], 3), (128, 1, [5, 0, 150, 1], None)])
def test_lowers_for_cuda_on_any_machine(num_heads, tokens_per_seq, lengths, splits, config):
  args = abstract_args(make_batch(np.random.default_rng(1), num_heads=num_heads,
                                  tokens_per_seq=tokens_per_seq, lengths=lengths, sink=0.3))
  fn = functools.partial(md.mosaic_decode, tokens_per_seq=tokens_per_seq,
                         num_kv_splits_=splits, config=CONFIGS[config])
  exported = export_for(fn, "cuda", *args,
                        custom_calls=["mosaic_gpu_v2", "__gpu$xla.gpu.triton"])
  assert "mosaic_gpu" in exported.mlir_module()
  if splits is not None:  # (the planner makes one split for the 128-head batch here)
    merged_by_kernel = splits > 1 and CONFIGS[config].merge == "kernel"  # (auto: xla here)
    assert ("jax_mla_merge_partials" in exported.mlir_module()) == merged_by_kernel


@pytest.mark.parametrize("bad,match", [
    (dict(split_rule="even"), r"split_rule must be one of \('fill', 'waves'\), got 'even'"),
    (dict(direct_registers=(240, 160, 152)), "direct_registers must be three multiples of 8"),
    (dict(direct_registers=(200, 196, 96)), "direct_registers must be three multiples of 8"),
    (dict(merge="triton"), r"merge must be one of \('auto', 'xla', 'kernel'\), got 'triton'")])
def test_bad_config_values_raise(bad, match):
  batch = make_batch(np.random.default_rng(2), num_heads=64, lengths=[3])
  with pytest.raises(ValueError, match=match):
    md.mosaic_decode(*batch.args(), tokens_per_seq=1, config=md.MosaicConfig(**bad))


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("num_heads,tokens_per_seq", [(16, 4), (64, 1), (128, 1)])
@pytest.mark.parametrize("splits", [1, None], ids=["one_split", "planned"])
def test_matches_oracle_over_heads_and_tokens(num_heads, tokens_per_seq, splits, config):
  rng = np.random.default_rng(num_heads * 10 + tokens_per_seq)
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                     lengths=[5, 0, 150, 1], sink=0.3, extra_indices=7)
  out, lse = run(batch, num_kv_splits=splits, config=config)
  check_against_oracle(batch, out, lse)


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("pattern", ["random", "same", "last"])
@pytest.mark.parametrize("design", list(DESIGNS))
def test_repeated_and_unsorted_indices(pattern, design):
  rng = np.random.default_rng(len(pattern))
  batch = make_batch(rng, num_heads=heads(design), lengths=[70, 3, 129], sink=0.1, index_pattern=pattern)
  out, lse = run(batch, num_kv_splits=2, config=DESIGNS[design])
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
