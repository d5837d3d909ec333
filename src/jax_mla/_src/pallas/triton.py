"""The Pallas GPU backend: the fp8 MLA decode as one Triton-lowered Pallas kernel (+ a merge).

Per program: one sequence, a block of its query rows (the heads of its tokens; the tokens of a
sequence share the KV list, so they are folded into the rows), one KV split. The program gathers
its KV rows by index, dequantizes the fp8 NoPE with the e8m0 tile scales and takes the bf16 RoPE
in the kernel, runs QK and PV on the tensor cores (bf16 operands, f32 accumulation) with an
online softmax in the log2 domain. The 512 dims are handled as 8 tiles of 64 (7 NoPE tiles and
the RoPE), the natural unit of the row format: no power-of-2 trouble with 448, no reshapes.

With one split the kernel finalizes (sink, empty rows) and writes bf16 out and lse; with more it
writes normalized f32 partials and their lse, merged by `merge.merge_partials` (jnp, on the GPU).

The score scale (`softmax_scale`, default 1/sqrt(512)) is a constant of the kernel. A second KV
source (`extra`: DeepSeek-V4 reads a sliding window and the compressed top-k, each its own
pool) is read by the same programs: a split walks its share of the sequence's blocks of the
first source, then of the second, with one online softmax; no pool is copied and the output
gets no second pass. Without it the kernel is the one-source kernel, op for op.

Q comes packed (fp8 rows and bf16 RoPE, dequantized in the kernel) or as the model holds it:
bf16 or f32 `[T, H, 512]` values read by the kernel as they are (f32 rounded to bf16 there),
so no XLA pass packs it first and no fp8 rounding touches it. So does each pool: packed rows,
or bf16/f32 rows `[R, 512]` with kv_rope None (DeepSeek-V4's window cache as servers keep it),
whose listed rows the kernel gathers and reads as bf16: no XLA gather and packing first.

Lengths and indices are device values; the split count depends on static shapes only, so one
executable serves every set of lengths. Padding bytes 462..511 are never read: the scale of
tile t is read at byte 448 + 2t and nothing else past byte 447.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jax_mla._src import layout
from jax_mla._src.pallas import merge as pallas_merge
from jax_mla._src.pallas import plan as pallas_plan
from jax_mla._src.kernel_math import (LN2, LOG2E, e8m0_to_f32, logaddexp2, score_scale_log2,
                                      split_chunks, split_two_sources)
TILE = layout.TILE  # 64
NUM_TILES = layout.NUM_TILES + 1  # 7 NoPE tiles + the RoPE tile


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """Block sizes and Triton launch parameters; the defaults are the ones measured best on the
  H200 (benchmarks/README.md). block_rows: query rows per program (power of 2, >= 16);
  block_kv: KV entries per inner step (power of 2, >= 16). (Other designs of the kernel are in
  the history: a 512-wide NoPE operand and Q dequantized by XLA were slower or no faster on the
  H200; a prefetch of the next block and QK in fp8 were never timed on a GPU;
  benchmarks/README.md.)"""
  block_rows: int = 64
  block_kv: int = 64
  num_warps: int = 8
  num_stages: int = 2
  min_split_entries: int = 256


def _compiler_params(config: KernelConfig):
  from jax.experimental.pallas import triton as plgpu  # pylint: disable=import-outside-toplevel
  # jax >= 0.7 calls it CompilerParams; older releases TritonCompilerParams.
  cls = getattr(plgpu, "CompilerParams", None) or getattr(plgpu, "TritonCompilerParams")
  return cls(num_warps=config.num_warps, num_stages=config.num_stages)


def _dequant_tile(raw, scale):
  """fp8 e4m3fn bytes [N, 64] times their tile scale bytes [N] -> bf16 [N, 64] (exact)."""
  values = jax.lax.bitcast_convert_type(raw, jnp.float8_e4m3fn).astype(jnp.float32)
  return (values * e8m0_to_f32(scale)[:, None]).astype(jnp.bfloat16)


def _dot(a, b, *, transpose_b=False):
  dims = (((1,), (1 if transpose_b else 0,)), ((), ()))
  return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _load_tiles(rows_ref, rope_ref, lead, rows):
  """The 8 dequantized bf16 tiles [N, 64] of packed rows `ref[*lead, rows]` (index array or
  slice): the 7 fp8 NoPE tiles times their scales, then the RoPE. rope_ref None: `rows_ref`
  holds the 512 values themselves (bf16 or f32: float Q), read as 8 tiles and rounded to bf16
  (round to nearest even; bf16 is read as it is)."""
  if rope_ref is None:
    return [rows_ref[(*lead, rows, pl.ds(t * TILE, TILE))].astype(jnp.bfloat16)
            for t in range(NUM_TILES)]
  raws = [rows_ref[(*lead, rows, pl.ds(t * TILE, TILE))] for t in range(layout.NUM_TILES)]
  # The first copy of each scale only; bytes 462.. (padding) are never touched.
  scales = [rows_ref[(*lead, rows, layout.SCALE_OFFSET + 2 * t)] for t in range(layout.NUM_TILES)]
  rope = rope_ref[(*lead, rows, pl.ds(0, layout.ROPE_DIM))]
  return [_dequant_tile(r, sc) for r, sc in zip(raws, scales)] + [rope.astype(jnp.bfloat16)]


# The 512 dims as 8 pieces of 64 columns: (column, width) = (64 t, 64).
PIECES = tuple((t * TILE, TILE) for t in range(NUM_TILES))


def _store_pieces(ref, lead, rows, values):
  for (col, width), value in zip(PIECES, values):
    ref[(*lead, rows, pl.ds(col, width))] = value.astype(ref.dtype)


def _decode_kernel(indptr_ref, indices_ref, q_ref, *refs, block_rows, block_kv, num_splits,
                   score_scale_log2, two_sources=False, float_q=False, float_kv=(False, False)):
  """refs: q_rope (packed Q only: float_q's q_ref holds the 512 values), kv, kv_rope, sink;
  with two_sources the second source's indptr, indices, kv and kv_rope; then the outputs. A
  split walks its share of the sequence's blocks, source A's then source B's, with one online
  softmax (kernel_math.split_two_sources). float_kv: per source (A, B), whether its kv holds
  the 512 values (bf16 or f32, rounded to bf16 as they are read), without a kv_rope ref."""
  if float_q:
    q_rope_ref = None
  else:
    q_rope_ref, refs = refs[0], refs[1:]
  (kv_ref, kv_rope_ref), refs = pallas_plan.pool_refs(refs, float_kv[0])
  sink_ref, *refs = refs
  seq, row_block, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  row0 = row_block * block_rows
  q_rows = pl.ds(row0, block_rows)

  if two_sources:
    indptr_b, indices_b, *refs = refs
    (kv_b, kv_rope_b), out_refs = pallas_plan.pool_refs(refs, float_kv[1])
    range_a, range_b = split_two_sources(indptr_ref, indptr_b, seq, split, num_splits, block_kv)
    walks = [(indices_ref, kv_ref, kv_rope_ref, *range_a), (indices_b, kv_b, kv_rope_b, *range_b)]
  else:
    out_refs = refs
    start = indptr_ref[seq]
    length, chunk_lo, chunk_hi = split_chunks(start, indptr_ref[seq + 1], split, num_splits,
                                              block_kv)
    walks = [(indices_ref, kv_ref, kv_rope_ref, start, length, chunk_lo, chunk_hi)]

  # Q dequantized (float Q: rounded to bf16) in the kernel: once per program, kept on chip for
  # the whole KV walk.
  q_pieces = _load_tiles(q_ref, q_rope_ref, (seq,), q_rows)

  def walk(carry, indices_ref, kv_ref, kv_rope_ref, start, length, chunk_lo, chunk_hi):
    """The online softmax over blocks chunk_lo .. chunk_hi - 1 of one source's list."""
    num_indices, num_kv_rows = indices_ref.shape[0], kv_ref.shape[0]

    def block_rows_of(chunk):
      offsets = chunk * block_kv + jnp.arange(block_kv, dtype=jnp.int32)
      valid = offsets < length
      # Clamped gather of the index list (never past the buffer), then select: lanes past the
      # row's end read pool row 0 and are zeroed before any arithmetic sees them.
      positions = jnp.minimum(start + offsets, num_indices - 1)
      # Out-of-range indices are clamped into the pool, as the reference does: never a wild
      # read.
      rows = jnp.clip(indices_ref[positions], 0, num_kv_rows - 1)
      return valid, jnp.where(valid, rows, 0)

    def body(chunk, carry):
      m, l, accs = carry
      valid, rows = block_rows_of(chunk)
      k_pieces = _load_tiles(kv_ref, kv_rope_ref, (), rows)
      k_pieces = [jnp.where(valid[:, None], k, jnp.zeros_like(k)) for k in k_pieces]
      scores = _dot(q_pieces[0], k_pieces[0], transpose_b=True)
      for qp, kp in zip(q_pieces[1:], k_pieces[1:]):
        scores += _dot(qp, kp, transpose_b=True)
      scores = jnp.where(valid[None, :], scores * score_scale_log2, -jnp.inf)
      m_new = jnp.maximum(m, jnp.max(scores, axis=1))  # finite: every chunk has a valid entry
      alpha = jnp.exp2(m - m_new)
      p = jnp.exp2(scores - m_new[:, None])
      l = l * alpha + jnp.sum(p, axis=1)
      p = p.astype(jnp.bfloat16)
      accs = tuple(acc * alpha[:, None] + _dot(p, kp) for acc, kp in zip(accs, k_pieces))
      return m_new, l, accs

    return jax.lax.fori_loop(chunk_lo, chunk_hi, body, carry)

  init = (jnp.full((block_rows,), -jnp.inf, jnp.float32),
          jnp.zeros((block_rows,), jnp.float32),
          tuple(jnp.zeros((block_rows, width), jnp.float32) for _, width in PIECES))
  carry = init
  for source in walks:
    carry = walk(carry, *source)
  m, l, accs = carry

  seen = l != 0  # NaN (a NaN scale in the row's data) counts as seen, so it propagates
  m_safe = jnp.where(seen, m, 0.0)
  lse2 = jnp.where(seen, m_safe + jnp.log2(jnp.where(seen, l, 1.0)), -jnp.inf)
  if num_splits == 1:
    out_ref, lse_ref = out_refs
    sink = sink_ref[q_rows]
    total2 = logaddexp2(lse2, sink * LOG2E)
    # out = acc * 2^(m - total): a +inf sink gives 2^-inf = 0; empty rows are selected to 0.
    weight = jnp.where(seen, jnp.exp2(m_safe - total2), 0.0)[:, None]
    _store_pieces(out_ref, (seq,), q_rows, [acc * weight for acc in accs])
    # An empty row's lse is the sink itself, not its round trip through log2 units.
    lse_ref[seq, q_rows] = jnp.where(seen, total2 * LN2, sink)
  else:
    part_ref, part_lse_ref = out_refs
    inv_l = jnp.where(seen, 1.0 / jnp.where(seen, l, 1.0), 0.0)[:, None]
    _store_pieces(part_ref, (seq, split), q_rows, [acc * inv_l for acc in accs])
    part_lse_ref[seq, split, q_rows] = lse2 * LN2


def _pad_rows(x, rows):
  pad = rows - x.shape[1]
  return x if pad == 0 else jnp.pad(x, ((0, 0), (0, pad), (0, 0)))


def pallas_decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, *, tokens_per_seq: int,
                  num_kv_splits: int | None = None, return_lse: bool = True,
                  softmax_scale: float | None = None, extra=None, interpret: bool = False,
                  config: KernelConfig | None = None):
  """Decode on the Pallas backend; arguments as `jax_mla.decode`, already validated.

  Args:
    q, q_rope: packed Q (uint8 `[T, H, 512]`, bf16 `[T, H, 64]`), or float Q: bf16 or f32
      `[T, H, 512]` values (RoPE in dims 448..511) with q_rope None, read by the kernel as they
      are; f32 is rounded to bf16 there (round to nearest even), the tensor cores' operand
      type. No fp8 rounding of Q either way.
    sink: f32 `[H]`; `-inf` means no sink.
    num_kv_splits: KV splits over the grid (with `extra`, splits of the two sources' entries
      together); None picks one from static shapes (`pallas_plan.num_kv_splits`).
    softmax_scale: the factor of q.k in the softmax, a Python float; None: 1 / sqrt(512).
    kv, kv_rope: packed rows (uint8 `[R, 512]`, bf16 `[R, 64]`), or a float
      pool: bf16 or f32 `[R, 512]` values (RoPE in dims 448..511) with kv_rope None, computed
      with as bf16 (no fp8 rounding). A bf16 pool is read by the kernel as it is; an f32 pool's
      listed rows are rounded to bf16 (nearest even) by XLA first (`_f32_pool_as_bf16_rows`).
    extra: None, or a second KV source `(kv2 uint8 [R2, 512], kv_rope2 bf16 [R2, 64],
      kv_indptr2 int32 [num_seqs + 1], kv_indices2 int32 [L2])` with its own pool (packed or
      float, as kv's): sequence b attends to the union of its entries in both sources (one
      softmax, one sink). Each split walks its share of the sequence's blocks of source A,
      then of source B, reading each pool in the kernel (kernel_math.split_two_sources).
    interpret: run the kernel in Pallas interpret mode (any backend, e.g. the CPU in tests).
    config: block sizes and Triton launch parameters; None: the defaults.

  Returns:
    `(out bf16 [T, H, 512], lse f32 [T, H] or None)`; lse is the natural log of the softmax
    denominator with the sink included. A sequence without KV entries gives out 0, lse = sink.
  """
  num_tokens, num_heads = q.shape[:2]
  num_seqs = kv_indptr.shape[0] - 1
  rows = tokens_per_seq * num_heads
  config = config or KernelConfig()
  block_rows = min(config.block_rows, pallas_plan.row_block(rows))
  padded_rows = -(-rows // block_rows) * block_rows
  num_indices = kv_indices.shape[0] + (0 if extra is None else extra[3].shape[0])
  num_splits = num_kv_splits or pallas_plan.num_kv_splits(
      num_seqs, padded_rows // block_rows, num_indices, config.block_kv,
      min_entries=config.min_split_entries)

  # [B, tokens * H, ...]: a free reshape; rows padded (zeros) only for odd head counts.
  float_q = q_rope is None
  q_inputs = (_pad_rows(q.reshape(num_seqs, rows, layout.ROW_BYTES), padded_rows),)
  if not float_q:
    q_inputs += (_pad_rows(q_rope.reshape(num_seqs, rows, layout.ROPE_DIM), padded_rows),)
  sink_rows = pallas_plan.sink_rows(sink, tokens_per_seq, padded_rows)
  extra_inputs = ()
  kv, kv_indices = _f32_pool_as_bf16_rows(kv, kv_rope, kv_indices)
  if extra is not None:
    kv2, kv_rope2, kv_indptr2, kv_indices2 = extra
    kv2, kv_indices2 = _f32_pool_as_bf16_rows(kv2, kv_rope2, kv_indices2)
    extra_inputs = (kv_indptr2, _one_index_at_least(kv_indices2),
                    *pallas_plan.pool_inputs(kv2, kv_rope2))
  # Float pools: the kernel reads their values (bf16; f32 rounded to bf16 there).
  options = pallas_plan.float_kv_option(kv_rope, extra)

  kernel = functools.partial(
      _decode_kernel, block_rows=block_rows, block_kv=config.block_kv, num_splits=num_splits,
      score_scale_log2=score_scale_log2(softmax_scale), two_sources=extra is not None,
      float_q=float_q, **options)
  params = {} if interpret else {"compiler_params": _compiler_params(config)}
  results = pl.pallas_call(
      kernel, out_shape=pallas_plan.result_types(num_seqs, num_splits, padded_rows),
      grid=(num_seqs, padded_rows // block_rows, num_splits),
      interpret=interpret, name="jax_mla_pallas_decode", **params,
  )(kv_indptr, _one_index_at_least(kv_indices), *q_inputs,
    *pallas_plan.pool_inputs(kv, kv_rope), sink_rows, *extra_inputs)

  out, lse = pallas_merge.finish(results, num_splits, sink, rows=rows, num_tokens=num_tokens,
                                 num_heads=num_heads)
  return out, (lse if return_lse else None)


def _f32_pool_as_bf16_rows(kv, kv_rope, kv_indices):
  """(pool, indices) for the kernel: an f32 float pool becomes its listed rows rounded to bf16
  (an XLA gather; the list becomes 0, 1, ...), any other pool stays as it is. Triton's f32 tiles
  overflow shared memory (the H200: 270 KB asked, 232 KB there, 2026-12-04), and servers keep
  their float caches in bf16. Indices are clamped as the kernel clamps them."""
  if kv_rope is not None or kv.dtype != jnp.float32 or kv.shape[0] == 0:
    return kv, kv_indices
  listed = jnp.clip(_one_index_at_least(kv_indices.astype(jnp.int32)), 0, kv.shape[0] - 1)
  rows = jnp.take(kv, listed, axis=0).astype(jnp.bfloat16)
  return rows, jnp.arange(listed.shape[0], dtype=jnp.int32)


def _one_index_at_least(indices):
  """The kernel needs one element of an index list to clamp to."""
  return jnp.zeros((1,), jnp.int32) if indices.shape[0] == 0 else indices
