"""jax_mla.plan.num_kv_splits: the occupancy pick, the hint cap, the latency model, bad input."""

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


@pytest.mark.parametrize("kwargs,error,name", [
    (dict(num_seqs=0, num_heads=16), ValueError, "num_seqs"),
    (dict(num_seqs=2.0, num_heads=16), TypeError, "num_seqs"),
    (dict(num_seqs=True, num_heads=16), TypeError, "num_seqs"),
    (dict(num_seqs=2, num_heads=0), ValueError, "num_heads"),
    (dict(num_seqs=2, num_heads="16"), TypeError, "num_heads"),
    (dict(num_seqs=2, num_heads=16, kv_len_hint=-1), ValueError, "kv_len_hint"),
    (dict(num_seqs=2, num_heads=16, kv_len_hint=3.5), TypeError, "kv_len_hint"),
])
def test_bad_arguments_name_the_argument(kwargs, error, name):
  with pytest.raises(error, match=name):
    plan.num_kv_splits(**kwargs)
