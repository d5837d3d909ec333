"""MaxText 0.2.5's DeepSeek-V4 `CompressedAttention`, decoding with `jax_mla.decode` as its core.

MaxText supplies the layer: its parameters and every sub-layer (the Q and KV projections with
their norms and RoPE, the HCA / CSA compressors, the CSA indexer's projections and scores, the
grouped output projection) are called from the imported `maxtext` package, never copied. This
module replaces only what MaxText's own decode does around them:

- the caches: one pool per KV source in jax_mla's layout, written with `jax_mla.update_cache`
  (fp8 packed rows) or a scatter (bf16 rows) — one row per token, never a copy of a pool:
    window:     a ring of `window_slots >= sliding_window_size` rows per sequence, row
                `b * window_slots + position % window_slots`;
    compressed: `max_length // compress_ratio` rows per sequence, row `b * C + block`;
  plus the indexer's compressed keys (f32, CSA layers) and the hidden states of the last
  `compress_ratio` (HCA) or `2 * compress_ratio` (CSA, the overlapping window) tokens, from which
  a compressed entry is made when its block completes;
- the attention: `jax_mla.decode` over the window (first source) and the compressed entries
  (`extra=`: all completed blocks on HCA layers, the indexer's top-k on CSA layers), with the
  layer's sinks and `softmax_scale=1.0` (MaxText folds `head_dim ** -0.5` into Q);
- the window: positions `p - W + 1 .. p` (MaxText's own training / prefill rule,
  `0 <= p - k < W`), not MaxText 0.2.5's decode-time window (docs/maxtext.md).

Conventions (each pinned by tests/test_maxtext_integration.py): MaxText's Q is already scaled,
so the decode scale is 1.0; V is K (all 512 dims, RoPE included) and the output's RoPE dims are
un-rotated with the query's position afterwards; the sink is a per-head logit in the softmax
denominator, counted once over both sources; RoPE occupies the trailing 64 dims (jax_mla's
448..511), so rows go to `pack_rows` as they are; a compressed block becomes visible at the step
of its last token.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from maxtext.common.common_types import MODEL_MODE_AUTOREGRESSIVE, MODEL_MODE_PREFILL
from maxtext.kernels.attention import csa_streamindex
from maxtext.layers import attention_compressed

import jax_mla

from maxtext_deepseek4 import cache as pools


class V4Cache(NamedTuple):
  """One layer's decode state for a batch (a pytree; donate it to `step`).

  window_kv, window_rope: the window pool, uint8 `[B * S, 512]` + bf16 `[B * S, 64]` (fp8) or
    bf16 `[B * S, 512]` + None.
  comp_kv, comp_rope: the compressed pool, `[B * C, 512]` likewise; None on window-only layers.
  index_keys: f32 `[B, C, indexer_head_dim]`, the CSA indexer's compressed keys; else None.
  history: `[B, Hn, emb_dim]` hidden states of the last Hn tokens, row `position % Hn`; None on
    window-only layers.
  length: int32 `[B]`, tokens cached so far (the position of the next token).
  """
  window_kv: jax.Array
  window_rope: jax.Array | None
  comp_kv: jax.Array | None
  comp_rope: jax.Array | None
  index_keys: jax.Array | None
  history: jax.Array | None
  length: jax.Array


class DecodeInputs(NamedTuple):
  """What `jax_mla.decode` receives for one step (`JaxMlaV4Decoder.inputs`)."""
  q: jax.Array                   # [B, H, 512], MaxText's scaled query
  sink: jax.Array                # f32 [H]
  window: jax_mla.KVSource
  extra: jax_mla.KVSource | None


class JaxMlaV4Decoder:
  """Decodes one MaxText `CompressedAttention` layer with jax_mla.

  Args:
    layer: a `maxtext.layers.attention_compressed.CompressedAttention` of any model mode (its own
      caches are never used; a TRAIN-mode layer allocates none). Its parameters are read at
      construction (`nnx.split`); call `refresh()` after changing them.
    batch: sequences decoded together.
    max_length: the longest sequence (prompt + generated tokens) the caches hold.
    window_slots: window rows per sequence (default: the layer's `sliding_window_size`).
    kv_format: "fp8" (jax_mla's packed rows, `update_cache`) or "bf16" (unquantized rows).
    backend: jax_mla's backend ("auto", "host", "reference", "pallas", "gfx950").
  """

  def __init__(self, layer, *, batch: int, max_length: int, window_slots: int | None = None,
               kv_format: str = "fp8", backend: str = "auto"):
    if kv_format not in pools.KV_FORMATS:
      raise ValueError(f"kv_format must be one of {pools.KV_FORMATS}; got {kv_format!r}")
    if layer.head_dim != pools.HEAD_DIM:
      raise ValueError(f"jax_mla needs head_dim {pools.HEAD_DIM}; the layer has {layer.head_dim}")
    self.ratio = int(layer.compress_ratio)
    if self.ratio not in (0, 4) and self.ratio <= 4:
      raise ValueError(f"compress_ratio must be 0, 4 (CSA) or > 4 (HCA); got {self.ratio}")
    self.window = int(layer.sliding_window_size)
    self.slots = int(window_slots or self.window)
    if self.slots < self.window:
      raise ValueError(f"window_slots {self.slots} < sliding_window_size {self.window}")
    self.batch, self.max_length = int(batch), int(max_length)
    self.kv_format, self.backend = kv_format, backend
    self.num_heads = int(layer.num_query_heads)
    self.emb_dim = int(layer.config.emb_dim)
    self.dtype = layer.dtype
    if self.ratio:
      self.comp_rows = max(1, self.max_length // self.ratio)
      self.history_len = 2 * self.ratio if self.ratio == 4 else self.ratio
    else:
      self.comp_rows = self.history_len = 0
    self.topk = int(layer.config.indexer_topk) if self.ratio == 4 else None
    self._graphdef, self.state = nnx.split(layer)
    self._prefill = jax.jit(self._prefill_impl, donate_argnums=1)
    self._step = jax.jit(self._step_impl, donate_argnums=1)
    self._inputs = jax.jit(self._inputs_impl)

  def refresh(self, layer) -> None:
    """Reads the layer's parameters again."""
    self._graphdef, self.state = nnx.split(layer)

  # ---- public entry points -------------------------------------------------------------------

  def init_cache(self) -> V4Cache:
    b = self.batch
    window_kv, window_rope = pools.empty_pool(b * self.slots, self.kv_format)
    comp_kv = comp_rope = index_keys = history = None
    if self.ratio:
      comp_kv, comp_rope = pools.empty_pool(b * self.comp_rows, self.kv_format)
      history = jnp.zeros((b, self.history_len, self.emb_dim), self.dtype)
    if self.ratio == 4:
      layer = nnx.merge(self._graphdef, self.state)
      index_keys = jnp.zeros((b, self.comp_rows, layer.csa_compressor.indexer.index_head_dim),
                             jnp.float32)
    return V4Cache(window_kv, window_rope, comp_kv, comp_rope, index_keys, history,
                   jnp.zeros((b,), jnp.int32))

  def prefill(self, cache: V4Cache, x: jax.Array) -> V4Cache:
    """Fills an empty cache from prompts x `[B, P, emb_dim]` (positions 0..P-1)."""
    if x.shape[1] > self.max_length:
      raise ValueError(f"prompt length {x.shape[1]} > max_length {self.max_length}")
    return self._prefill(self.state, cache, x)

  def step(self, cache: V4Cache, x: jax.Array) -> tuple[jax.Array, V4Cache]:
    """One decode step: x `[B, 1, emb_dim]` at position `cache.length` -> (out `[B, 1,
    emb_dim]`, the updated cache). The cache is donated (updated in place)."""
    return self._step(self.state, cache, x)

  def inputs(self, cache: V4Cache, x: jax.Array) -> DecodeInputs:
    """The `jax_mla.decode` inputs of the step `step(cache, x)` would take (cache not donated)."""
    return self._inputs(self.state, cache, x)

  # ---- the pieces ----------------------------------------------------------------------------

  def _layer(self, state):
    return nnx.merge(self._graphdef, state)

  def _pool_csa(self, module, x, positions, head_dim):
    """MaxText's CSA overlap pooling (compute_csa_prefill_chunk_pooling) of x's whole windows."""
    return attention_compressed.compute_csa_prefill_chunk_pooling(
        kv=module.kv_proj(x), gate=module.gate_proj(x), seq_len=x.shape[1],
        batch_size=x.shape[0], compress_rate=self.ratio, position_ids=positions,
        position_bias=module.position_bias[...], kv_norm=module.kv_norm,
        rotary_emb=module.rotary_emb, head_dim=head_dim, dtype=self.dtype, cache=None)[0]

  def _compress(self, layer, x, positions):
    """Compressed entries (and CSA index keys) of x's complete windows: `[B, n, 512]`,
    `[B, n, Di]` or None. MaxText's prefill-path compressors, called as they are."""
    if self.ratio > 4:
      comp, _ = layer.hca_compressor(x, None, positions, MODEL_MODE_PREFILL, None)
      return comp[:, :, 0], None
    csa = layer.csa_compressor
    comp = self._pool_csa(csa, x, positions, layer.head_dim)
    keys = self._pool_csa(csa.indexer, x, positions, csa.indexer.index_head_dim)
    return comp, keys

  def _prefill_impl(self, state, cache: V4Cache, x):
    layer = self._layer(state)
    b, p, _ = x.shape
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    kv, _ = layer.compressed_kv_projection(x, positions, MODEL_MODE_PREFILL)
    seq = jnp.arange(b, dtype=jnp.int32)[:, None]
    keep = positions >= p - self.slots
    window_kv, window_rope = pools.write_rows(
        cache.window_kv, cache.window_rope, kv[:, :, 0],
        jnp.where(keep, seq * self.slots + positions % self.slots, -1))
    cache = cache._replace(window_kv=window_kv, window_rope=window_rope,
                           length=jnp.full((b,), p, jnp.int32))
    if not self.ratio:
      return cache
    hist_pos = jnp.arange(max(p - self.history_len, 0), p)
    history = cache.history.at[:, hist_pos % self.history_len].set(x[:, hist_pos])
    n = p // self.ratio
    if n > self.comp_rows:
      raise ValueError(f"{n} compressed blocks > {self.comp_rows} rows (max_length)")
    comp_kv, comp_rope = cache.comp_kv, cache.comp_rope
    index_keys = cache.index_keys
    if n:
      comp, keys = self._compress(layer, x, positions)
      blocks = jnp.arange(n, dtype=jnp.int32)
      comp_kv, comp_rope = pools.write_rows(comp_kv, comp_rope, comp,
                                            seq * self.comp_rows + blocks[None, :])
      if keys is not None:
        index_keys = index_keys.at[:, :n].set(keys.astype(jnp.float32))
    return cache._replace(comp_kv=comp_kv, comp_rope=comp_rope, index_keys=index_keys,
                          history=history)

  def _update(self, layer, cache: V4Cache, x):
    """Writes the token at `cache.length` (window row, history, a completed compressed block);
    returns (cache, q [B, 1, H, 512], q_normed, positions [B, 1])."""
    b = self.batch
    pos = cache.length
    positions = pos[:, None]
    q, q_normed = layer.compressed_query_projection(x, positions, MODEL_MODE_AUTOREGRESSIVE)
    kv, _ = layer.compressed_kv_projection(x, positions, MODEL_MODE_AUTOREGRESSIVE)
    seq = jnp.arange(b, dtype=jnp.int32)
    window_kv, window_rope = pools.write_rows(cache.window_kv, cache.window_rope, kv[:, 0, 0],
                                         seq * self.slots + pos % self.slots)
    cache = cache._replace(window_kv=window_kv, window_rope=window_rope, length=pos + 1)
    if not self.ratio:
      return cache, q, q_normed, positions
    hn, r = self.history_len, self.ratio
    history = cache.history.at[seq, pos % hn].set(x[:, 0].astype(cache.history.dtype))
    complete = ((pos + 1) % r == 0) & ((pos + 1) // r <= self.comp_rows)
    block = (pos + 1) // r - 1

    def compress(operands):
      comp_kv, comp_rope, index_keys = operands
      # The last hn tokens in position order; on CSA the earlier window is the overlap prior.
      tok_pos = pos[:, None] + 1 - hn + jnp.arange(hn, dtype=jnp.int32)[None, :]
      window_x = jnp.take_along_axis(history, (tok_pos % hn)[:, :, None], axis=1)
      if r == 4:
        # Block 0 has no prior window: a gap in the positions makes MaxText's pooling treat the
        # prior as another document's (kv 0, gate -inf), as its AR path does for an empty prior.
        tok_pos = jnp.where(tok_pos < 0, tok_pos - r, tok_pos)
      comp, keys = self._compress(layer, window_x, tok_pos)
      slots = jnp.where(complete, seq * self.comp_rows + block, -1)
      comp_kv, comp_rope = pools.write_rows(comp_kv, comp_rope, comp[:, -1], slots)
      if keys is not None:
        rows = jnp.where(complete, block, self.comp_rows)
        index_keys = index_keys.at[seq, rows].set(keys[:, -1].astype(jnp.float32), mode="drop")
      return comp_kv, comp_rope, index_keys

    operands = (cache.comp_kv, cache.comp_rope, cache.index_keys)
    comp_kv, comp_rope, index_keys = jax.lax.cond(jnp.any(complete), compress, lambda o: o,
                                                  operands)
    cache = cache._replace(comp_kv=comp_kv, comp_rope=comp_rope, index_keys=index_keys,
                           history=history)
    return cache, q, q_normed, positions

  def _indexer_topk(self, layer, cache: V4Cache, x, q_normed, positions, num_blocks):
    """The CSA indexer's top-k over the completed blocks: local block ids [B, k], -1 unused.
    Its projections, RoPE and scores are MaxText's (DeepseekV4Indexer's AR path)."""
    indexer = layer.csa_compressor.indexer
    b = x.shape[0]
    q = indexer.q_proj(q_normed).reshape((b, 1, indexer.index_n_heads, indexer.index_head_dim))
    q = indexer.rotary_emb(jnp.transpose(q, (0, 2, 1, 3)), positions, unsqueeze_dim=1)
    weights = indexer.weights_proj(x).astype(jnp.float32) * indexer.weights_scaling
    scores = csa_streamindex.csa_indexer_scores_jax(
        q, cache.index_keys, weights, softmax_scale=indexer.softmax_scale,
        precision=layer.config.matmul_precision)[:, 0]         # [B, C]
    return pools.topk_blocks(scores, num_blocks, self.topk)

  def _decode_inputs(self, layer, cache: V4Cache, x, q, q_normed, positions) -> DecodeInputs:
    window = pools.window_source(cache.window_kv, cache.window_rope, positions,
                                 window=self.window, slots=self.slots)
    extra = None
    if self.ratio:
      num_blocks = jnp.minimum(cache.length // self.ratio, self.comp_rows)
      if self.ratio == 4:
        local = self._indexer_topk(layer, cache, x, q_normed, positions, num_blocks)
      else:
        local = pools.all_blocks(num_blocks, self.comp_rows)
      extra = pools.compressed_source(cache.comp_kv, cache.comp_rope, local, self.comp_rows)
    sink = layer.sinks[...].astype(jnp.float32)
    return DecodeInputs(q[:, 0], sink, window, extra)

  def _attend(self, inputs: DecodeInputs):
    # MaxText's Q already carries head_dim ** -0.5: the softmax runs at scale 1.
    return pools.attend(inputs.q, inputs.sink, inputs.window, inputs.extra, softmax_scale=1.0,
                        backend=self.backend)

  def _project_out(self, layer, attn, positions):
    """MaxText's epilogue: un-rotate the RoPE dims at the query position, then the grouped
    output projection (o_a_proj, o_b_proj)."""
    unrotate = layer._apply_rotary_embedding_v4  # pylint: disable=protected-access
    attn = unrotate(attn, positions, unsqueeze_dim=-2, reverse=True)
    b, s, h, d = attn.shape
    groups = layer.config.o_groups
    grouped = layer.o_a_proj(attn.reshape(b, s, groups, (h * d) // groups))
    return layer.o_b_proj(grouped.reshape(b, s, -1))

  def _inputs_impl(self, state, cache: V4Cache, x):
    layer = self._layer(state)
    cache, q, q_normed, positions = self._update(layer, cache, x)
    return self._decode_inputs(layer, cache, x, q, q_normed, positions)

  def _step_impl(self, state, cache: V4Cache, x):
    layer = self._layer(state)
    cache, q, q_normed, positions = self._update(layer, cache, x)
    inputs = self._decode_inputs(layer, cache, x, q, q_normed, positions)
    attn = self._attend(inputs).astype(self.dtype)[:, None]   # [B, 1, H, 512]
    return self._project_out(layer, attn, positions), cache
