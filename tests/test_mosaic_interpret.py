"""The interpret-mode harness of the Mosaic kernel (support/mosaic_interpret.py) catches what it
is there to catch: a synchronization error is reported, and a block handed another
block's carried loads computes a wrong result. (The kernel's own oracle tests in interpret mode
are test_mosaic.py's and test_pallas_sources.py's "interpret" cases.)"""

import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

from support import mosaic_interpret
from support.child_process import child_env, neutral_cwd
from support.rows import make_batch
from test_mosaic import INTERPRET, check_against_oracle, decoder
from jax_mla._src.pallas.mosaic import gather as mosaic_gather


@pytest.mark.parametrize("rank", [None, 0, 1])
def test_carried_slots_follow_the_producers_row_groups(rank):
  """Unpaired (rank None): each warp's first row groups; paired: every row of the CTA's half."""
  rows = mosaic_interpret._carried_rows(rank)  # pylint: disable=protected-access
  slots = [int(mosaic_interpret.slot_of(r, rank)) for r in range(mosaic_gather.BLOCK_ROWS)]
  assert sorted(s for s in slots if s >= 0) == list(range(len(rows)))
  assert all(rows[s] == r for r, s in enumerate(slots) if s >= 0)
  assert slots.count(-1) == mosaic_gather.BLOCK_ROWS - len(rows)
  if rank is not None:
    assert sorted(rows) == list(range(32 * rank, 32 * rank + 32))


def _batch():
  return make_batch(np.random.default_rng(5), num_heads=64, lengths=[200, 3], pool_rows=1024,
                    sink=0.3)


def _decode(batch, monkeypatch):
  with mosaic_interpret.interpreted(monkeypatch):
    out, lse = decoder(1, 1)(*batch.args()[:-1], batch.sink_array())
  return np.asarray(jnp.asarray(out, jnp.float32)), np.asarray(lse)


@INTERPRET
def test_the_unchanged_kernel_passes(monkeypatch):
  """The control for the next test: the same problem, the kernel as it is."""
  batch = _batch()
  check_against_oracle(batch, *_decode(batch, monkeypatch))


@INTERPRET
def test_a_block_given_its_own_loads_as_the_next_ones_is_wrong(monkeypatch):
  """If a step carried its own block's loads into the next one (the kernel's pipelining done
  wrong), the next block computes with the wrong rows: the oracle comparison fails."""
  def wrong_step(kv_ref, rope_ref, idx_ref, num_valid, next_idx_ref, next_num_valid, *rest,
                 **kw):
    del next_idx_ref, next_num_valid
    return mosaic_interpret.gather_step(kv_ref, rope_ref, idx_ref, num_valid, idx_ref,
                                        num_valid, *rest, **kw)
  batch = _batch()
  with mosaic_interpret.interpreted(monkeypatch):
    monkeypatch.setattr(mosaic_gather, "gather_step", wrong_step)
    out, lse = decoder(1, 1)(*batch.args()[:-1], batch.sink_array())
  with pytest.raises(AssertionError):
    check_against_oracle(batch, np.asarray(jnp.asarray(out, jnp.float32)), np.asarray(lse))


_NO_WAITS = textwrap.dedent("""
    import numpy as np
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from support import mosaic_interpret
    from support.rows import make_batch
    from jax_mla._src.pallas.mosaic import decode as md

    class Patch:
      def setattr(self, module, name, value):
        setattr(module, name, value)

    wait = plgpu.barrier_wait

    def waits_for_the_tiles_only(barrier):
      # The tiles' barriers are indexed (k_full.at[tile]); P's and the row factors' are not.
      if getattr(barrier, "transforms", ()):
        wait(barrier)

    plgpu.barrier_wait = waits_for_the_tiles_only
    batch = make_batch(np.random.default_rng(5), num_heads=64, lengths=[200, 3], pool_rows=1024,
                       sink=0.3)
    with mosaic_interpret.interpreted(Patch()):
      md.mosaic_decode(*batch.args()[:-1], batch.sink_array(), tokens_per_seq=1,
                       num_kv_splits_=1)
    print("no race reported")
""")


@INTERPRET
def test_a_kernel_without_its_p_barrier_waits_is_reported():
  """Warpgroups 0 and 1 not waiting for each other's hand-over of P: the interpreter reports a
  race, or a barrier phase that completed unobserved (arrivals overrunning its waiter). In a
  child process: the interpreter's state is not reusable after it reported one."""
  proc = subprocess.run([sys.executable, "-c", _NO_WAITS], capture_output=True, text=True,
                        timeout=600, check=False, cwd=neutral_cwd(), env=child_env())
  assert proc.returncode != 0, proc.stdout
  assert ("RACE DETECTED" in proc.stderr
          or "but no threads observed phase" in proc.stderr), proc.stderr[-3000:]
  assert "no race reported" not in proc.stdout
