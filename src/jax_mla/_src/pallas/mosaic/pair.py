"""Two CTAs of a cluster sharing the gather (whenever the 64-row blocks are even in number): at
128 query rows per sequence the two 64-row blocks read the same KV rows, so each producer
gathers and dequantizes half of every block and writes it into both CTAs' K tiles (FlashMLA's
sm90 kernel pairs its two head blocks the same way). Passes the GPU tests on the H200, and is
10% faster there than the unpaired kernel (2026-12-03: 246.8 against 277.0 us at 128 heads,
B 128, K 2048; benchmarks/README.md).

The peer's half of a packed pool's block arrives by one bulk copy per half of the tile
(copy_to_peer: `cp.async.bulk` from the sender's tile into the receiver's, once the sender's
producer has stored its rows locally), a float pool's by `st.async` (mosaic.gather's pair mode:
each thread's 16-byte stores, once locally and once into the peer). Either counts its bytes
on an mbarrier of the receiving CTA, as a TMA copy does. Pallas does not expose its barriers'
addresses to inline PTX, so those "ready" barriers live in a plain int32 SMEM scratch
(ready_barriers) and are driven here in PTX: per K tile one barrier that completes when this
CTA's 128 producer threads have arrived and the peer's PEER_BYTES have landed.

The bulk copy took the paired kernel from 175.9 to 158.4 us at 128 heads, B 128, K 2048 and
from 28.9 to 26.4 at B 64, K 512 (H100, 2026-12-05, benchmarks/README.md): an ncu source view
(H200) had the producer waiting on its shared-memory queue in 36% of its samples, behind the
per-thread st.async stores (the unpaired producer, storing locally only: 7%). Float pools keep
st.async: their bulk form has not run on a GPU.

Lifetime: the barriers are initialized and published to the peer before anyone uses them
(init_ready_barriers: a cluster-wide barrier), and neither CTA exits while the other may still
write into its shared memory or arrive on its barriers (cluster_sync at the end).
"""

from __future__ import annotations

import jax.numpy as jnp

from jax_mla._src.pallas.mosaic.gather import BLOCK_ROWS, HALF, PEER_BYTES, barrier_address


def ready_barriers(num_tiles):
  """The scratch type of the ready barriers: one 8-byte mbarrier (two int32) per K tile."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  return plgpu.SMEM((2 * num_tiles,), jnp.int32)


def _ir():
  # pylint: disable=import-outside-toplevel
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import arith, llvm
  return mgpu_utils, ir, arith, llvm


def _void_asm(operands, text, constraints):
  _, ir, _, llvm = _ir()
  llvm.inline_asm(ir.Type.parse("!llvm.void"), operands, text, constraints,
                  has_side_effects=True)


def _thread_in_block():
  from jaxlib.mlir.dialects import gpu  # pylint: disable=import-outside-toplevel
  _, ir, arith, _ = _ir()
  return arith.index_cast(ir.IntegerType.get_signless(32), gpu.thread_id(gpu.Dimension.x))


def init_ready_barriers(ready_ref):
  """Called by every thread of the CTA before the roles branch: thread 0 initializes the
  barriers (128 arrivals each: the local producer's threads), then the whole cluster syncs, so
  that no peer writes to a barrier before it exists."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),))
  def init(ctx, ready):
    del ctx
    mgpu_utils, ir, arith, _ = _ir()
    i32 = ir.IntegerType.get_signless(32)
    first = arith.cmpi(arith.CmpIPredicate.eq, _thread_in_block(), mgpu_utils.c(0, i32))
    for tile in range(ir.MemRefType(ready.type).shape[0] // 2):
      _void_asm([first, barrier_address(ready, mgpu_utils.c(tile, i32))],
                "@$0 mbarrier.init.shared::cta.b64 [$1], 128;", "b,r")
    _void_asm([], "fence.mbarrier_init.release.cluster;", "")
    _cluster_barrier()

  init(ready_ref)


def _cluster_barrier():
  # Not .aligned: the call at the end follows the roles' divergent branches.
  _void_asm([], "barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;", "")


def cluster_sync():
  """Every thread of both CTAs, at the end: no CTA exits while its peer may still store into
  its shared memory or arrive on its barriers."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel

  @plgpu.inline_mgpu()
  def sync(ctx):
    del ctx
    _cluster_barrier()

  sync()


def sent_range(rank, half):
  """(first byte, bytes) in a K tile of the rows a pair's CTA of rank `rank` fills in the tile's
  half `half` (rows 32 rank .. 32 rank + 31: contiguous in the tile's (8, 32)-tiled layout).
  rank: a Python int (tests) or an i32 IR value (mosaic.gather._Int; the first byte is one
  too)."""
  size = PEER_BYTES // 2
  return half * BLOCK_ROWS * HALF * 2 + rank * size, size


def copy_to_peer(k_tile_ref, ready_ref, tile, rank):
  """Called by the producer warpgroup after its local stores of K tile `tile` (a packed pool's);
  once every thread's stores are fenced for the async proxy, thread 0 copies this CTA's rows
  (sent_range, each half of the tile) into the same place of the peer's tile, the bytes
  counted on the peer's ready barrier of that tile (as st.async's are)."""
  # pylint: disable=import-outside-toplevel
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from jax_mla._src.pallas.mosaic.gather import _Int, _peer_window, k_tile_transforms
  scalar = plgpu.Layout.WG_SPLAT(shape=())

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(k_tile_transforms()), plgpu.RefType(), scalar,
                                scalar))
  def send(ctx, k, ready, tile_, rank_):
    del ctx
    mgpu_utils, ir, arith, llvm = _ir()
    i32 = ir.IntegerType.get_signless(32)
    k_base = llvm.ptrtoint(i32, mgpu_utils.memref_ptr(k))
    rank_value = rank_.registers.flat[0]
    offset, peer_barrier = _peer_window(k_base, rank_value,
                                        barrier_address(ready, tile_.registers.flat[0]))
    _void_asm([], "fence.proxy.async.shared::cta;", "")
    mgpu_utils.warpgroup_barrier()
    lane = arith.remui(_thread_in_block(), mgpu_utils.c(128, i32))
    first = arith.cmpi(arith.CmpIPredicate.eq, lane, mgpu_utils.c(0, i32))
    for h in range(2):
      start, size = sent_range(_Int(rank_value), h)
      source = arith.addi(k_base, start.value)
      _void_asm([first, arith.addi(source, offset), source, mgpu_utils.c(size, i32),
                 peer_barrier],
                "@$0 cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes "
                "[$1], [$2], $3, [$4];", "b,r,r,r,r")

  send(k_tile_ref, ready_ref, tile, rank)


def arrive_filled(ready_ref, tile):
  """Called by the producer warpgroup after its gather into K tile `tile`: each thread fences
  its stores for the async proxy (wgmma) and arrives; thread 0's arrival also expects the
  PEER_BYTES the peer delivers (its bulk copy or its st.async)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.Layout.WG_SPLAT(shape=())))
  def arrive(ctx, ready, tile_):
    del ctx
    mgpu_utils, ir, arith, _ = _ir()
    i32 = ir.IntegerType.get_signless(32)
    address = barrier_address(ready, tile_.registers.flat[0])
    lane = arith.remui(_thread_in_block(), mgpu_utils.c(128, i32))
    first = arith.cmpi(arith.CmpIPredicate.eq, lane, mgpu_utils.c(0, i32))
    _void_asm([], "fence.proxy.async.shared::cta;", "")
    _void_asm([first, address, mgpu_utils.c(PEER_BYTES, i32)],
              "{\n\t.reg .pred rest;\n\t.reg .b64 state;\n\tnot.pred rest, $0;\n\t"
              "@$0 mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 state, [$1], $2;\n\t"
              "@rest mbarrier.arrive.release.cta.shared::cta.b64 state, [$1];\n\t}", "b,r,r")

  arrive(ready_ref, tile)


def wait_filled(ready_ref, tile, parity):
  """Waits (every thread of the calling warpgroup) until K tile `tile` holds both halves of
  its block: the barrier's phase of parity `parity` (0 or 1, int32) has completed."""
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel

  scalar = plgpu.Layout.WG_SPLAT(shape=())

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), scalar, scalar))
  def wait(ctx, ready, tile_, parity_):
    del ctx
    # pylint: disable=import-outside-toplevel
    from jaxlib.mlir.dialects import scf
    mgpu_utils, ir, arith, llvm = _ir()
    i32 = ir.IntegerType.get_signless(32)
    address = barrier_address(ready, tile_.registers.flat[0])
    parity_value = parity_.registers.flat[0]
    loop = scf.WhileOp([], [])
    before = loop.before.blocks.append()
    after = loop.after.blocks.append()
    with ir.InsertionPoint(before):
      done = llvm.inline_asm(
          i32, [address, parity_value],
          "{\n\t.reg .pred p;\n\t"
          "mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2;\n\t"
          "selp.u32 $0, 1, 0, p;\n\t}", "=r,r,r", has_side_effects=True)
      scf.ConditionOp(arith.cmpi(arith.CmpIPredicate.eq, done, mgpu_utils.c(0, i32)), [])
    with ir.InsertionPoint(after):
      scf.YieldOp([])

  wait(ready_ref, tile, parity)
