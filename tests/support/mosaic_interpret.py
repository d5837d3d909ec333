"""The Mosaic GPU kernel on the CPU: Mosaic GPU's interpret mode runs its warpgroups as threads
over simulated shared memory and mbarriers, with race detection. What it cannot run is the
kernel's inline Mosaic IR (plgpu.inline_mgpu: the producer's per-thread loads and fp8
conversions, the softmax's lane shuffles, the epilogue's per-row sink loads, a pair's PTX
barriers and st.async into the peer), barriers shared across a cluster, a wgmma whose A
operand is in registers, the Triton-style merge kernel, and the splits' merge through
distributed shared memory (mosaic.cluster_merge: interpret mode runs those splits through
partials and pallas.merge instead). `interpreted` replaces those with
stand-ins written in Pallas and jnp, to the same contracts (pair_stand_ins says what the
paired model leaves out);
everything else (the roles, their barriers and tile phases, the split plan, the masks, the
softmax, the epilogues and the merges) is the kernel's own code. So a missing wait or arrival,
a wrong tile or phase, or a block given to the wrong step or rows to the wrong CTA fails here,
on any machine; the leaves are checked bit for bit on an H200 (tests/test_mosaic*.py, marked
`gpu`).

The pipelined gather's stand-in keeps the kernel's contract for the loads it carries: what
`gather_issue` or a `gather_step` returns holds the pool rows of the next block's carried row
groups, and the step that converts that block uses them, so a block handed the wrong carried
loads gets the wrong rows (and a row the carry says is absent but the block says is valid
turns NaN).

The gathers' stand-ins work a block at a time: one load of the pool (and of the index list), the
rows picked with jnp, one store per half of the tile. Each load or store inside an interpreted
kernel is a callback; row by row, they made about 95% of an interpreted decode's callbacks and
most of its time.
"""

from __future__ import annotations

import contextlib
import faulthandler

import jax
import jax.numpy as jnp

from jax_mla._src import layout
from jax_mla._src.pallas import merge as pallas_merge
from jax_mla._src.pallas.mosaic import consumer as mosaic_consumer
from jax_mla._src.pallas.mosaic import decode as mosaic_decode
from jax_mla._src.pallas.mosaic import gather as mosaic_gather
from jax_mla._src.pallas.mosaic import pair as mosaic_pair

BLOCK = mosaic_gather.BLOCK_ROWS
# A deadlock leaves the interpreter's threads waiting forever: dump every thread's stack and
# end the process instead (pytest-xdist reports the crashed test).
DEADLOCK_TIMEOUT_S = 600


def available() -> tuple[bool, str]:
  """(whether this jax has Mosaic GPU's interpret mode, why not)."""
  try:
    from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    return False, f"jax.experimental.pallas.mosaic_gpu does not import: {e}"
  if not hasattr(plgpu, "force_gpu_interpret_mode"):
    return False, f"jax {jax.__version__} has no Mosaic GPU interpret mode"
  if tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 12):
    # Its interpreter requires every warpgroup to observe every phase of every barrier; the
    # producer never waits for its last tiles' release (nor need it, on the hardware).
    return False, f"jax {jax.__version__}'s Mosaic GPU interpreter needs 0.12 for this kernel"
  return True, ""


def _carried_rows(rank=None):
  """The block rows (0..63) whose loads the producer carries into the next step: unpaired, the
  first CARRIED_GROUPS row groups of each warp; paired, every row of its CTA's half."""
  paired = rank is not None
  return [mosaic_gather.block_row(warp, group, row, rank)
          for warp in range(4) for group in range(mosaic_gather.CARRIED_GROUPS[paired])
          for row in range(mosaic_gather.ROWS_PER_LOAD)]


def slot_of(r, rank=None):
  """Block row r's place in _carried_rows(rank), or -1 (arithmetic: a kernel captures no
  array constant)."""
  paired = rank is not None
  per_warp = BLOCK // (8 if paired else 4)
  carried = mosaic_gather.CARRIED_GROUPS[paired] * mosaic_gather.ROWS_PER_LOAD
  x = r - (rank * (BLOCK // 2) if paired else 0)
  inside = (x >= 0) & (x < 4 * per_warp) & (x % per_warp < carried)
  return jnp.where(inside, x // per_warp * carried + x % per_warp, -1)


def _pool_rows(kv_ref, rope_ref, rows):
  """Pool rows `rows` (int32 [BLOCK], each in 0 .. N - 1) as bf16 [BLOCK, 512]: dequantized
  (packed) or rounded (float rows). The whole pool in one load: the interpreter has no gather
  from a ref, and one load per row (a callback each) made most of an interpreted decode's
  time."""
  picked = jnp.take(kv_ref[...], rows, axis=0)
  if rope_ref is None:
    return picked.astype(jnp.bfloat16)
  return layout.unpack_rows(picked, jnp.take(rope_ref[...], rows, axis=0), jnp.bfloat16)


def _fill(kv_ref, rope_ref, row_of, num_valid, tile):
  """Rows row_of(r) of the pool into tile rows r < num_valid; zeros past it (row_of takes the
  block's rows r = 0 .. BLOCK - 1 at once; what it gives past num_valid is never used). A
  row outside the pool (negative: a carried load that says "no row" where the block has one,
  loads handed to the wrong block) is stored as NaN. One load of the pool and one store per
  half of the tile, the bytes the kernel writes (every row of the tile)."""
  r = jnp.arange(BLOCK, dtype=jnp.int32)
  rows = row_of(r)
  num_rows = kv_ref.shape[0]
  outside = (rows < 0) | (rows >= num_rows)
  values = _pool_rows(kv_ref, rope_ref, jnp.clip(rows, 0, num_rows - 1))
  values = jnp.where(outside[:, None], jnp.nan, values)
  values = jnp.where((r < num_valid)[:, None], values, 0).astype(jnp.bfloat16)
  tile[0] = values[:, :mosaic_gather.HALF]
  tile[1] = values[:, mosaic_gather.HALF:]


def _entries(idx_ref, r):
  """Entries r (int32 [n]) of a block's view of an index list, idx.at[pl.ds(first, BLOCK)] as
  the kernel passes it. The view may run past the list's end, where the kernel reads nothing:
  the whole list is read in one load and the positions past it read its last entry."""
  ref, transforms = getattr(idx_ref, "ref", idx_ref), getattr(idx_ref, "transforms", ())
  first = 0
  if transforms:
    (indexer,) = transforms
    (window,) = indexer.indices
    first = window.start
  entries = ref[...]
  return jnp.take(entries, jnp.minimum(first + r, entries.shape[0] - 1))


def _listed(idx_ref, num_rows, clamp):
  def row_of(r):
    row = _entries(idx_ref, r)
    return jnp.clip(row, 0, num_rows - 1) if clamp else row
  return row_of


def gather_consecutive(rows_ref, rope_ref, first_row, num_valid, smem):
  _fill(rows_ref, rope_ref, lambda r: first_row + r, num_valid, smem)


def copy_consecutive(rows_ref, first_row, num_valid, smem):
  _fill(rows_ref, None, lambda r: first_row + r, num_valid, smem)


def gather_float(kv_ref, idx_ref, num_valid, k_smem, *, clamp=False, pair=None):
  del pair  # paired: the whole block into this CTA's tile (see pair_stand_ins)
  _fill(kv_ref, None, _listed(idx_ref, kv_ref.shape[0], clamp), num_valid, k_smem)


def _issue(idx_ref, num_rows, num_valid, clamp, rank):
  """The carried loads of a block: its carried rows' pool rows (in _carried_rows(rank)'s
  order: slot_of), -1 where invalid."""
  r = jnp.arange(BLOCK, dtype=jnp.int32)
  rows = jnp.where(r < num_valid, _listed(idx_ref, num_rows, clamp)(r), -1)
  carried = jnp.zeros(mosaic_gather.carried_type(rank is not None).shape, jnp.int32)
  slot = slot_of(r, rank)
  return carried.at[jnp.where(slot >= 0, slot, carried.shape[0])].set(rows, mode="drop")


def gather_issue(kv_ref, rope_ref, idx_ref, num_valid, *, clamp=False, rank=None):
  del rope_ref
  return _issue(idx_ref, kv_ref.shape[0], num_valid, clamp, rank)


def gather_step(kv_ref, rope_ref, idx_ref, num_valid, next_idx_ref, next_num_valid, k_smem,
                carried, *, clamp=False, rank=None):
  """Paired (rank given): the whole block into this CTA's tile, its own half from the carried
  loads (see pair_stand_ins)."""
  listed = _listed(idx_ref, kv_ref.shape[0], clamp)

  def row_of(r):
    slot = slot_of(r, rank)
    return jnp.where(slot >= 0, carried[jnp.maximum(slot, 0)], listed(r))
  _fill(kv_ref, rope_ref, row_of, num_valid, k_smem)
  return _issue(next_idx_ref, kv_ref.shape[0], next_num_valid, clamp, rank)


def running_max(s, m_i):
  """consumer.running_max's contract per row (the kernel decides per warp of 16 rows; any m that
  no score passes by more than MAX_SLACK_LOG2 gives the same result)."""
  row_max = s.max(axis=1)
  passed = ~(row_max <= m_i + mosaic_consumer.MAX_SLACK_LOG2)  # NaN passes
  return jnp.where(passed, jnp.maximum(m_i, row_max), m_i)


def row_sum(x, *, lanes):
  """consumer._row_sum's contract, each row summed at once (lanes: nothing left to add)."""
  del lanes
  return x.sum(axis=1) if x.ndim == 2 else x


def row_sinks(sink_ref, row0, heads):
  """consumer.row_sinks: row r's sink is sink_ref[r % heads]."""
  return jnp.take(sink_ref[...], (row0 + jnp.arange(BLOCK)) % heads)


def accumulate_pv(acc, p, k_tiles, at):
  """consumer.accumulate_pv: the interpreter's wgmma takes no operand from registers."""
  if not isinstance(p, jax.Array):
    p = p[...]
  return acc + jnp.dot(p.astype(jnp.float32), k_tiles.at[at][...].astype(jnp.float32))


def pair_stand_ins(plgpu):
  """Paired CTAs (mosaic.pair): the interpreter has no st.async or bulk copy into the peer's
  shared memory and no barriers shared across a cluster, so each CTA's producer gathers the
  whole block into its own tile (gather_step, gather_float), copy_to_peer sends nothing, and
  the pair's barriers become each CTA's own:
  `ready` a barrier the producer arrives on, k_free one its two consumers arrive on. What stays
  the kernel's: the cluster grid, each CTA's rows (its rank), its half of the carried loads,
  and the roles' order of waits and arrivals on those barriers. Not covered: the bytes that
  cross to the peer, and each CTA waiting for the other's consumers before refilling."""
  def ready_barriers(num_tiles):
    return plgpu.Barrier(num_arrivals=1, num_barriers=num_tiles)

  def arrive_filled(ready_ref, tile):
    plgpu.commit_smem()
    plgpu.barrier_arrive(ready_ref.at[tile])

  def wait_filled(ready_ref, tile, parity):
    del parity  # the interpreter tracks each waiter's phase itself
    plgpu.barrier_wait(ready_ref.at[tile])

  def cluster_barrier(*, collective_axes, num_arrivals=1, num_barriers=1, **kwargs):
    del collective_axes, kwargs
    return plgpu.Barrier(num_arrivals=num_arrivals, num_barriers=num_barriers)

  return [
      (mosaic_pair, "ready_barriers", ready_barriers),
      (mosaic_pair, "init_ready_barriers", lambda ready_ref: None),
      (mosaic_pair, "arrive_filled", arrive_filled),
      (mosaic_pair, "copy_to_peer", lambda k_tile_ref, ready_ref, tile, rank: None),
      (mosaic_pair, "wait_filled", wait_filled),
      (mosaic_pair, "cluster_sync", lambda: None),
      (plgpu, "ClusterBarrier", cluster_barrier),
  ]


def merge_stand_in(plgpu):
  """The merge kernel (pallas.merge.finish's "auto" rule) is Triton-style Pallas,
  which Mosaic GPU's interpreter does not run: it runs in Pallas's own interpret mode."""
  kernel = pallas_merge.merge_kernel

  def merge_kernel(*args, interpret=False, **kwargs):
    del interpret
    with plgpu.force_gpu_interpret_mode(None):
      return kernel(*args, interpret=True, **kwargs)
  return [(pallas_merge, "merge_kernel", merge_kernel)]


STAND_INS = [
    (mosaic_gather, "gather_consecutive", gather_consecutive),
    (mosaic_gather, "copy_consecutive", copy_consecutive),
    (mosaic_gather, "gather_float", gather_float),
    (mosaic_gather, "gather_issue", gather_issue),
    (mosaic_gather, "gather_step", gather_step),
    (mosaic_consumer, "running_max", running_max),
    (mosaic_consumer, "_row_sum", row_sum),
    (mosaic_consumer, "row_sinks", row_sinks),
    (mosaic_consumer, "accumulate_pv", accumulate_pv),
]


@contextlib.contextmanager
def interpreted(monkeypatch, *, detect_races=True):
  """Within it, mosaic.decode's kernel (called eagerly, not under jit) runs in Mosaic GPU's
  interpret mode with the stand-ins; a race fails the call, a deadlock the process."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  for module, name, stand_in in STAND_INS + pair_stand_ins(plgpu) + merge_stand_in(plgpu):
    monkeypatch.setattr(module, name, stand_in)
  # The interpreter has no distributed shared memory: a cluster of splits merging there
  # (mosaic.cluster_merge) is checked on hardware only; here the same splits write partials.
  monkeypatch.setattr(mosaic_decode, "CLUSTER_MERGE_SPLITS", ())
  faulthandler.dump_traceback_later(DEADLOCK_TIMEOUT_S, exit=True)
  try:
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams(detect_races=detect_races)):
      yield
  finally:
    faulthandler.cancel_dump_traceback_later()
