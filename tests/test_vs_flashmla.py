"""benchmarks/vs_flashmla.py's suites (its timing needs a GPU and FlashMLA): "flash" and
"others" split "all" exactly, so a run cut by a time limit can be completed by the other."""

import pytest

import vs_flashmla
from timing import call_loop


def test_flash_and_others_are_the_two_halves_of_all():
  flash, others = vs_flashmla.shapes("all")
  assert len(flash) == 30 and all(t == 1 and h in (64, 128) for h, t, _, _ in flash)
  assert vs_flashmla.shapes("flash") == (flash, [])
  assert vs_flashmla.shapes("others") == ([], others)
  assert {(h, t) for h, t, _, _ in others} == set(vs_flashmla.OTHER_LAYOUTS)
  assert all(b >= 32 for _, _, b, _ in others)


def test_unknown_suite_is_refused():
  with pytest.raises(KeyError):
    vs_flashmla.shapes("everything")


def test_the_timed_loop_runs_the_public_decode_with_changing_indices():
  """The loop both vs_flashmla.py and mosaic_ab.py time (here through the reference backend):
  STEPS decodes of the shape's problem, each at indices moved on by STRIDE, each output the
  loop's carry: it returns the last call's output (to a bf16 rounding: XLA fuses the call
  differently inside the loop), and not the one before."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import jax_mla
  rng = np.random.default_rng(0)
  pool = jnp.asarray(rng.standard_normal((vs_flashmla.POOL, 512)).astype(np.float32))
  kv, kv_rope = jax_mla.pack_rows(pool)
  args = vs_flashmla.call_args((16, 1, 2, 64))
  np.testing.assert_array_equal(np.asarray(args[4]), [0, 64, 128])
  call = jax.jit(vs_flashmla.decode_call(kv, kv_rope, 1, "reference"))
  got = np.asarray(vs_flashmla.looped(call)(*args), np.float32)
  assert got.shape == (2, 16, 512) and np.isfinite(got).all()
  moved = lambda i: (args[2] + i * call_loop.STRIDE) & (vs_flashmla.POOL - 1)
  last = np.asarray(call(*args[:2], moved(vs_flashmla.STEPS - 1), *args[3:]), np.float32)
  one_rounding = lambda a, b: np.all(np.abs(a - b) <= 2.0**-8 * np.abs(b) + 1e-6)
  assert one_rounding(got, last)
  before = np.asarray(call(*args[:2], moved(vs_flashmla.STEPS - 2), *args[3:]), np.float32)
  assert not one_rounding(got, before)
  update = np.asarray(vs_flashmla.looped(vs_flashmla.index_update)(*args))
  np.testing.assert_array_equal(update, np.asarray(moved(vs_flashmla.STEPS - 1)))
