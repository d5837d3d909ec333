"""jax_mla.plan.num_kv_splits: the occupancy pick, the hint cap, the latency model, bad input;
planner.host_num_kv_splits, the host backend's plan, and which plan split_decode takes."""

import math

import pytest

from jax_mla import plan
from jax_mla._src.aiter import planner


def occupancy_oracle(num_seqs, num_heads, cu=256):
  """KERNELS.md section 3, brute force in floats: highest score, ties to the smallest i."""
  bs_occ = num_seqs * math.ceil(num_heads / 64)
  scores = [(bs_occ * i / (math.ceil(bs_occ * i / cu) * cu), -i) for i in range(1, 17)]
  return -max(scores)[1]


@pytest.mark.parametrize("num_seqs", [1, 2, 3, 5, 7, 16, 17, 31, 64, 100, 128, 129, 255, 256,
                                      300, 1000, 4096])
@pytest.mark.parametrize("num_heads", [8, 16, 32, 64, 128])
def test_occupancy_pick(num_seqs, num_heads):
  got = plan.num_kv_splits(num_seqs, num_heads)
  assert isinstance(got, int)
  assert got == occupancy_oracle(num_seqs, num_heads)


@pytest.mark.parametrize("args,want", [((1, 128), 16), ((64, 128), 2), ((128, 128), 1),
                                       ((3, 16), 16), ((100, 64), 5), ((256, 128), 1)])
def test_known_values(args, want):
  assert plan.num_kv_splits(*args) == want


@pytest.mark.parametrize("hint,cap", [(0, 1), (1, 1), (32, 1), (33, 2), (100, 4), (10_000, 16)])
def test_kv_len_hint_caps_at_tile_count(hint, cap):
  assert plan.num_kv_splits(1, 128, kv_len_hint=hint) == cap  # uncapped pick is 16


def test_latency_model_used_when_coefficients_exist(monkeypatch):
  coeffs = planner.LatencyCoeffs(wave_us=2.0, tile_us=0.5, partial_us=1.0, merge_us=3.0,
                                 default_kv_len=4096)
  monkeypatch.setitem(planner.LATENCY_MODEL_COEFFS, "gfx950", coeffs)

  def latency(s, num_seqs, num_heads, kv_len):
    waves = math.ceil(num_seqs * math.ceil(num_heads / 64) * s / 256)
    extra = coeffs.partial_us * s + coeffs.merge_us if s > 1 else 0.0
    return waves * (coeffs.wave_us + coeffs.tile_us * math.ceil(kv_len / 32 / s)) + extra

  for num_seqs, kv_len in [(1, 4096), (64, 4096), (4, 100), (300, 8192)]:
    want = min(range(1, 17), key=lambda s: (latency(s, num_seqs, 128, kv_len), s))
    hint = None if kv_len == 4096 else kv_len
    assert plan.num_kv_splits(num_seqs, 128, kv_len_hint=hint) == want
  assert plan.num_kv_splits(1, 128) != occupancy_oracle(1, 128)  # the model really decided


def test_latency_table_ships_empty():
  assert planner.LATENCY_MODEL_COEFFS == {}


def test_unknown_arch_names_the_known_ones():
  with pytest.raises(ValueError, match=r"gfx942.*known: \['gfx950'\]"):
    plan.num_kv_splits(4, 128, arch="gfx942")


@pytest.mark.parametrize("picker", [plan.num_kv_splits, planner.host_num_kv_splits],
                         ids=["gfx950", "host"])
@pytest.mark.parametrize("kwargs,error,message", [
    (dict(num_seqs=0, num_heads=16), ValueError, r"num_seqs must be >= 1, got 0"),
    (dict(num_seqs=2.0, num_heads=16), TypeError, r"num_seqs must be an int, got float 2.0"),
    (dict(num_seqs=True, num_heads=16), TypeError, r"num_seqs must be an int, got bool True"),
    (dict(num_seqs=2, num_heads=0), ValueError, r"num_heads must be >= 1, got 0"),
    (dict(num_seqs=2, num_heads="16"), TypeError, r"num_heads must be an int, got str '16'"),
    (dict(num_seqs=2, num_heads=16, kv_len_hint=-1), ValueError,
     r"kv_len_hint must be >= 0, got -1"),
    (dict(num_seqs=2, num_heads=16, kv_len_hint=3.5), TypeError,
     r"kv_len_hint must be an int, got float 3.5"),
])
def test_bad_arguments_name_the_argument(picker, kwargs, error, message):
  """Both pickers check the batch's arguments alike."""
  with pytest.raises(error, match=message):
    picker(**kwargs)


# --- the host backend's plan: for the CPU it runs on --------------------------------------------

@pytest.mark.parametrize("num_seqs,threads,want", [
    (1, 1, 1), (1, 2, 2), (2, 2, 1), (3, 2, 1), (64, 2, 1), (1, 8, 8), (3, 8, 3), (1, 64, 16),
    (100, 64, 1)])
def test_host_plan_gives_each_thread_a_task(num_seqs, threads, want):
  """A (sequence, split) task holds all of a sequence's heads: splits only until every thread
  has a task (the executor merges and writes the LSE at any count, one split included)."""
  for num_heads in (16, 128):
    got = planner.host_num_kv_splits(num_seqs, num_heads, threads=threads)
    assert got == want
    assert num_seqs * got >= min(threads, num_seqs * planner.MAX_SPLITS)  # a task per thread


def test_host_plan_hint_keeps_splits_long():
  assert planner.host_num_kv_splits(1, 128, threads=8, kv_len_hint=1024) == 4  # 256 each
  assert planner.host_num_kv_splits(1, 128, threads=8, kv_len_hint=10) == 1


def test_host_plan_threads_default_to_the_affinity():
  assert planner.host_threads() >= 1
  assert planner.host_num_kv_splits(1, 128) == min(16, planner.host_threads())


@pytest.mark.parametrize("threads,error,message", [
    (0, ValueError, r"threads must be >= 1, got 0"),
    (2.0, TypeError, r"threads must be an int, got float 2.0"),
])
def test_host_plan_bad_threads(threads, error, message):
  with pytest.raises(error, match=message):
    planner.host_num_kv_splits(2, 16, threads=threads)


def _planned_splits(backend, num_seqs, return_lse=True):
  """The num_kv_splits split_decode binds for num_kv_splits=None (traced, nothing runs)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jax_mla._src.aiter import split  # pylint: disable=import-outside-toplevel
  args = (jax.ShapeDtypeStruct((num_seqs, 128, 512), jnp.uint8),
          jax.ShapeDtypeStruct((num_seqs, 128, 64), jnp.bfloat16),
          jax.ShapeDtypeStruct((64, 512), jnp.uint8), jax.ShapeDtypeStruct((64, 64), jnp.bfloat16),
          jax.ShapeDtypeStruct((num_seqs + 1,), jnp.int32), jax.ShapeDtypeStruct((99,), jnp.int32),
          jax.ShapeDtypeStruct((128,), jnp.float32))
  jaxpr = jax.make_jaxpr(lambda *a: split.split_decode(
      *a, tokens_per_seq=1, num_kv_splits=None, backend=backend, return_lse=return_lse))(*args)
  (eqn,) = [e for e in jaxpr.eqns if e.primitive is split.split_decode_p]
  return eqn.params["num_kv_splits"]


def test_split_decode_plans_the_host_for_the_cpu_and_gfx950_for_the_mi355x():
  """backend='host' with num_kv_splits=None takes the CPU's plan; the gfx950 plan (the MI355X
  occupancy pick, 16 at batch 1) stays what backend='gfx950' gets and what plan.num_kv_splits
  says."""
  assert _planned_splits("host", 1) == planner.host_num_kv_splits(1, 128)
  assert _planned_splits("host", 64) == 1  # the executor writes the LSE at one split too
  assert _planned_splits("host", 64, return_lse=False) == 1
  assert _planned_splits("gfx950", 1) == plan.num_kv_splits(1, 128) == 16
  assert _planned_splits("gfx950", 64) == plan.num_kv_splits(64, 128)
