"""benchmarks/vs_flashmla.py's suites (its timing needs a GPU and FlashMLA): "flash" and
"others" split "all" exactly, so a run cut by a time limit can be completed by the other."""

import pytest

import vs_flashmla


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
  STEPS decodes of the shape's problem, each at indices moved on by STRIDE; the sum it keeps
  live is finite and is the sum of the steps' first output elements."""
  import jax.numpy as jnp
  import numpy as np
  import jax_mla
  rng = np.random.default_rng(0)
  pool = jnp.asarray(rng.standard_normal((vs_flashmla.POOL, 512)).astype(np.float32))
  kv, kv_rope = jax_mla.pack_rows(pool)
  data = vs_flashmla.problem(16, 1, 2, 64)
  q, q_rope = jax_mla.pack_rows(jnp.asarray(data["q"]))
  args = (q, q_rope, jnp.asarray(data["indices"]), jnp.asarray(data["sink"]))
  call = vs_flashmla.decode_call(kv, kv_rope, 1, "reference")
  total = float(vs_flashmla.looped(call)(*args))
  assert np.isfinite(total)
  expected = sum(float(call(q, q_rope, (args[2] + i * vs_flashmla.STRIDE) & (vs_flashmla.POOL - 1),
                            args[3]).reshape(-1)[0].astype(jnp.float32))
                 for i in range(vs_flashmla.STEPS))
  np.testing.assert_allclose(total, expected, rtol=1e-5, atol=1e-5)
  update = float(vs_flashmla.looped(vs_flashmla.index_update)(*args))
  first = int(args[2][0, 0])  # the index update's output: the moved indices
  assert update == sum((first + i * vs_flashmla.STRIDE) % vs_flashmla.POOL
                      for i in range(vs_flashmla.STEPS))
