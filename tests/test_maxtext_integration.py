"""MaxText 0.2.5's DeepSeek-V4 CompressedAttention decoding through jax_mla
(examples/maxtext_deepseek4, docs/maxtext.md), on a tiny config on the CPU: head_dim 512, RoPE 64,
64 query heads, one latent KV head, random sinks, a window of 4, CSA (ratio 4, the indexer's
top-3) and HCA (ratio 8) layers and a window-only layer.

- attention alone: jax_mla.decode against MaxText's own AttentionOp on the same (dequantized)
  cache entries, for every decode step;
- end to end: the layer's output over 9 decode steps against MaxText's full-sequence forward
  (its training path, whose window is the model's), and against MaxText's decode where the
  window covers the whole context;
- MaxText 0.2.5's decode-time window, pinned as it is (the masks its AttentionOp builds), and
  its effect on the layer's output; its compressed AR ring overwriting a block with zeros;
- every convention difference (scale, sink, RoPE dims, window edges, when a compressed block
  becomes visible, the indexer's top-k, MaxText's compressed index space).

Needs the `maxtext` extra (MaxText installed with --no-deps; pyproject.toml). Skipped when MaxText
is not importable, except with JAX_MLA_REQUIRE_MAXTEXT=1 (CI's maxtext stage), where it must run.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

REQUIRED = os.environ.get("JAX_MLA_REQUIRE_MAXTEXT") == "1"
MAXTEXT_VERSION = "0.2.5"  # the window behaviour pinned below is this release's

try:
  import importlib.metadata
  import flax  # noqa: F401  pylint: disable=unused-import
  from maxtext.common import common_types
  from maxtext.layers import embeddings
  _version = importlib.metadata.version("maxtext")
except ImportError as e:  # pragma: no cover - depends on the environment
  if REQUIRED:
    raise
  pytest.skip(f"MaxText is not importable ({e!r}); install the maxtext extra (docs/maxtext.md) "
              "or set JAX_MLA_REQUIRE_MAXTEXT=1 to make this an error", allow_module_level=True)
if _version != MAXTEXT_VERSION:  # pragma: no cover
  if REQUIRED:
    raise AssertionError(f"maxtext {_version} is installed; these tests pin {MAXTEXT_VERSION}")
  pytest.skip(f"maxtext {_version} is installed; these tests pin {MAXTEXT_VERSION}",
              allow_module_level=True)

import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position

import jax_mla  # pylint: disable=wrong-import-position

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from maxtext_deepseek4 import decoder, model  # pylint: disable=wrong-import-position

# MaxText 0.2.5 on flax 0.12 uses Variable APIs flax deprecates: its warnings, not ours.
pytestmark = [
    pytest.mark.filterwarnings("ignore:'.value' access is now deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:'sharding' is deprecated:DeprecationWarning"),
]

AR = common_types.MODEL_MODE_AUTOREGRESSIVE
PREFILL = common_types.MODEL_MODE_PREFILL
TRAIN = common_types.MODEL_MODE_TRAIN

PROMPT = 12     # = max_prefill_predict_length: the prompt fills MaxText's prefill cache
STEPS = 9       # decode steps; = MaxText's AR cache length (max_target - max_prefill), no wrap
WINDOW = 4
RATIOS = (0, 4, 8)   # window only, CSA, HCA
SHAPE = {**model.TINY_SHAPE, "window": WINDOW}
HEADS = SHAPE["num_heads"]


def rel_l2(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def setup():
  cfg = model.config(max_prefill=PROMPT, max_target=PROMPT + STEPS, **SHAPE)
  return cfg, model.mesh(cfg)


@pytest.fixture(scope="module")
def tokens(setup):
  cfg, _ = setup
  return jax.random.normal(jax.random.key(7), (1, PROMPT + STEPS, cfg.emb_dim), jnp.float32)


class Spy:
  """Records MaxText's AttentionOp calls and the masks it builds, changing nothing."""

  def __init__(self, layer):
    self.layer, self.op = layer, layer.attention_op
    self.calls, self.masks = [], []

  def __enter__(self):
    op, spy = self.op, self
    build_mask = op.generate_attention_mask

    def masks(*args, **kwargs):
      mask = build_mask(*args, **kwargs)
      spy.masks.append(np.asarray(mask))
      return mask

    class Op:
      def __call__(self, *args, **kwargs):
        out = op(*args, **kwargs)
        spy.calls.append((args, kwargs, out))
        return out

    object.__setattr__(op, "generate_attention_mask", masks)
    object.__setattr__(self.layer, "attention_op", Op())
    return self

  def __exit__(self, *exc):
    object.__setattr__(self.layer, "attention_op", self.op)
    object.__delattr__(self.op, "generate_attention_mask")


class Run:
  """One layer type: MaxText's AR layer (prefill, then STEPS decode steps, recorded), the same
  parameters in a TRAIN layer (the full-sequence forward)."""

  def __init__(self, cfg, the_mesh, ratio, x):
    self.ratio = ratio
    with jax.set_mesh(the_mesh):
      self.ar = model.layer(cfg, the_mesh, compress_ratio=ratio, model_mode=AR)
      model.randomize(self.ar, seed=ratio + 1)
      train = model.layer(cfg, the_mesh, compress_ratio=ratio, model_mode=TRAIN)
      model.copy_params(self.ar, train)
      positions = jnp.arange(PROMPT + STEPS)[None]
      self.full, _ = train(x, x, jnp.ones(positions.shape, jnp.int32), positions,
                           deterministic=True, model_mode=TRAIN)
      self.ar(x[:, :PROMPT], x[:, :PROMPT], jnp.ones((1, PROMPT), jnp.int32),
              positions[:, :PROMPT], deterministic=True, model_mode=PREFILL)
      self.steps = []   # per step: (prefill-pass mask, AR-pass mask, AttentionOp call, output)
      for p in range(PROMPT, PROMPT + STEPS):
        with Spy(self.ar) as spy:
          out, _ = self.ar(x[:, p:p + 1], x[:, p:p + 1], None, positions[:, p:p + 1],
                           deterministic=True, model_mode=AR)
        assert len(spy.masks) == 2 and len(spy.calls) == 1
        self.steps.append((spy.masks[0].reshape(-1), spy.masks[1].reshape(-1), spy.calls[0],
                           out))


@pytest.fixture(scope="module")
def runs(setup, tokens):
  cfg, the_mesh = setup
  return {ratio: Run(cfg, the_mesh, ratio, tokens) for ratio in RATIOS}


_DECODER_RUNS = {}


def run_decoder(run, x, *, kv_format, backend, prompt=PROMPT):
  """The integration over the same tokens: (outputs [1, emb] per step, DecodeInputs per step);
  memoized per layer, format, backend and prompt length."""
  key = (run.ratio, kv_format, backend, prompt)
  if key not in _DECODER_RUNS:
    _DECODER_RUNS[key] = _run_decoder(run, x, kv_format=kv_format, backend=backend, prompt=prompt)
  return _DECODER_RUNS[key]


def _run_decoder(run, x, *, kv_format, backend, prompt):
  dec = decoder.JaxMlaV4Decoder(run.ar, batch=1, max_length=PROMPT + STEPS,
                                kv_format=kv_format, backend=backend)
  cache = dec.prefill(dec.init_cache(), x[:, :prompt])
  outs, inputs = [], []
  for p in range(prompt, PROMPT + STEPS):
    inputs.append(dec.inputs(cache, x[:, p:p + 1]))
    out, cache = dec.step(cache, x[:, p:p + 1])
    outs.append(out[:, 0])
  return outs, inputs


# ---- MaxText 0.2.5's decode-time window, as it is --------------------------------------------

def ar_cache_len(run):
  return run.steps[0][1].shape[0] - compressed_len(run)


def compressed_len(run):
  compressed_kv = run.steps[0][2][1]["compressed_kv"]
  return 0 if compressed_kv is None else compressed_kv.shape[1]


def maxtext_window(run, step):
  """The uncompressed positions MaxText's decode attends at `step` (from its masks)."""
  prefill_mask, ar_mask, _, _ = run.steps[step]
  prefill = set(np.nonzero(prefill_mask > -1)[0].tolist())
  ar = np.nonzero(ar_mask[:ar_cache_len(run)] > -1)[0]
  return prefill | {PROMPT + int(j) for j in ar}


@pytest.mark.parametrize("ratio", RATIOS)
def test_maxtext_decode_window_as_it_is(runs, ratio):
  """MaxText 0.2.5's decode window (attention_op.py, generate_attention_mask) differs from its
  training / prefill window (`0 <= p - k < W`), which the integration implements:
  - the prefill cache is aligned as if its last slot were the current position: the last W
    prompt tokens are attended at every step, however far decoding has moved on;
  - compressed layers (CSA, HCA) add the decoded tokens within W: the window grows from W + 1
    to 2W tokens and never drops a prompt token;
  - window-only layers (LOCAL_SLIDING) anchor their AR-cache mask at the cache's last slot:
    only AR slots A - W .. A - 1 (A = max_target_length - max_prefill_predict_length) are
    attended, so for the first A - W steps no decoded token, not even the current one."""
  run = runs[ratio]
  a = ar_cache_len(run)
  assert a == STEPS
  last_prompt = set(range(PROMPT - WINDOW, PROMPT))
  for step in range(STEPS):
    p = PROMPT + step
    if ratio:
      decoded = {PROMPT + j for j in range(step + 1) if step - j < WINDOW}
    else:
      decoded = {PROMPT + j for j in range(max(a - WINDOW, 0), min(step, a - 1) + 1)}
    assert maxtext_window(run, step) == last_prompt | decoded, step
    correct = set(range(p - WINDOW + 1, p + 1))
    assert maxtext_window(run, step) != correct
  # The window-only layer's first A - W steps see no decoded token, not even the current one.
  if not ratio:
    for step in range(a - WINDOW):
      assert not maxtext_window(run, step) & set(range(PROMPT, PROMPT + STEPS))


def test_maxtext_decode_window_with_a_short_prompt(setup, tokens):
  """A prompt shorter than max_prefill_predict_length (padded, segment id 0): the window-only
  layer's prefill-cache mask is anchored at the padded buffer's last slot, so it attends only the
  prompt tokens among the buffer's last W slots (here 2 of W = 4); the compressed layers anchor
  at the last valid slot (the last W prompt tokens)."""
  cfg, the_mesh = setup
  prompt, x = PROMPT - 2, tokens
  segments = jnp.array([[1] * prompt + [0] * (PROMPT - prompt)], jnp.int32)
  with jax.set_mesh(the_mesh):
    for ratio, expected in ((0, {8, 9}), (4, {6, 7, 8, 9})):
      layer = model.layer(cfg, the_mesh, compress_ratio=ratio, model_mode=AR)
      layer(x[:, :PROMPT], x[:, :PROMPT], segments, jnp.arange(PROMPT)[None], deterministic=True,
            model_mode=PREFILL)
      for p in (prompt, prompt + 1):
        with Spy(layer) as spy:
          layer(x[:, p:p + 1], x[:, p:p + 1], None, jnp.array([[p]]), deterministic=True,
                model_mode=AR)
        assert set(np.nonzero(spy.masks[0].reshape(-1) > -1)[0].tolist()) == expected, (ratio, p)


@pytest.mark.parametrize("ratio", RATIOS)
def test_maxtext_decode_deviates_from_its_own_forward(runs, ratio):
  """The window above changes the layer's output: MaxText's decode is far from its own
  full-sequence forward at every step (the integration is within 1e-2 of it, below)."""
  run = runs[ratio]
  errors = [rel_l2(out[:, 0], run.full[:, PROMPT + s]) for s, (*_, out) in enumerate(run.steps)]
  assert min(errors) > 0.1, errors


def test_maxtext_decode_matches_its_forward_when_the_window_covers_the_context(setup, tokens):
  """With W >= the context (and a compressed cache with room to spare, see the next test),
  MaxText's decode equals its full-sequence forward, so the window is the only difference
  above; and the integration equals MaxText's decode step by step."""
  cfg, the_mesh = setup
  x = tokens
  wide = PROMPT + STEPS
  positions = jnp.arange(wide)[None]
  with jax.set_mesh(the_mesh):
    for ratio in (4, 8):
      ar = model.layer(cfg, the_mesh, compress_ratio=ratio, model_mode=AR, window=wide,
                       max_target=24)   # a multiple of both ratios
      model.randomize(ar, seed=11)
      train = model.layer(cfg, the_mesh, compress_ratio=ratio, model_mode=TRAIN, window=wide)
      model.copy_params(ar, train)
      full, _ = train(x, x, jnp.ones(positions.shape, jnp.int32), positions, deterministic=True,
                      model_mode=TRAIN)
      dec = decoder.JaxMlaV4Decoder(ar, batch=1, max_length=wide, kv_format="bf16",
                                    backend="reference")
      cache = dec.prefill(dec.init_cache(), x[:, :PROMPT])
      ar(x[:, :PROMPT], x[:, :PROMPT], jnp.ones((1, PROMPT), jnp.int32), positions[:, :PROMPT],
         deterministic=True, model_mode=PREFILL)
      for p in range(PROMPT, wide):
        theirs, _ = ar(x[:, p:p + 1], x[:, p:p + 1], None, positions[:, p:p + 1],
                       deterministic=True, model_mode=AR)
        ours, cache = dec.step(cache, x[:, p:p + 1])
        assert rel_l2(theirs[:, 0], full[:, p]) < 1e-5, (ratio, p)
        assert rel_l2(ours[:, 0], theirs[:, 0]) < 1e-2, (ratio, p)


# ---- attention alone -------------------------------------------------------------------------

def dequantized(rows):
  """rows [..., 512] through jax_mla's packed fp8 format and back (f32)."""
  return jax_mla.unpack_rows(*jax_mla.pack_rows(jnp.asarray(rows, jnp.float32)))


def replay(run, step, *, q=None, dequantize=True):
  """MaxText's AttentionOp call of `step` again, with the cache entries (and q, if given)
  replaced; returns its output [H, 512] and the inputs jax_mla needs."""
  args, kwargs, _ = run.steps[step][2]
  (pk, pv, pseg), (ak, av, aseg, lengths) = kwargs["cached_values"]
  comp = kwargs["compressed_kv"]
  fix = dequantized if dequantize else (lambda a: a)
  cached = [(fix(pk), fix(pv), pseg), (fix(ak), fix(av), aseg, lengths)]
  new_kwargs = dict(kwargs, cached_values=cached,
                    compressed_kv=None if comp is None else fix(comp))
  query = args[0] if q is None else q
  out = run.ar.attention_op(query, *args[1:], **new_kwargs)
  return np.asarray(out[0, 0]), pk[0, :, 0], ak[0, :, 0], (None if comp is None else comp[0, :, 0])


def maxtext_lists(run, step):
  """MaxText's attended entries at `step` as jax_mla index lists: window rows into
  [prefill cache; AR cache], compressed rows into compressed_kv."""
  prefill_mask, ar_mask, _, _ = run.steps[step]
  a = ar_cache_len(run)
  window = np.concatenate([np.nonzero(prefill_mask > -1)[0],
                           prefill_mask.shape[0] + np.nonzero(ar_mask[:a] > -1)[0]])
  comp = np.nonzero(ar_mask[a:] > -1)[0]

  def as_list(rows, size):  # one shape for every step (entries past indptr[1] are not read)
    indices = np.zeros(max(size, 1), np.int32)
    indices[:len(rows)] = rows
    return jnp.array([0, len(rows)], jnp.int32), jnp.asarray(indices)

  return as_list(window, prefill_mask.shape[0] + a), as_list(comp, ar_mask.shape[0] - a)


def jax_mla_attention(run, step, *, backend, softmax_scale=1.0, sink=True):
  args, kwargs, _ = run.steps[step][2]
  _, pk, ak, comp = replay(run, step)
  (w_indptr, w_indices), (c_indptr, c_indices) = maxtext_lists(run, step)
  window_kv, window_rope = jax_mla.pack_rows(jnp.concatenate([pk, ak]).astype(jnp.float32))
  extra = None
  if comp is not None:
    extra = jax_mla.KVSource(*jax_mla.pack_rows(comp.astype(jnp.float32)), c_indptr, c_indices)
  sinks = kwargs["sinks"].astype(jnp.float32) if sink else None
  out, _ = jax_mla.decode(args[0][:, 0], None, window_kv, window_rope, w_indptr, w_indices,
                          sinks, extra=extra, softmax_scale=softmax_scale, backend=backend)
  return np.asarray(out[0], np.float32)


def host_query(q):
  """The Q the host kernel sees: MaxText's (scaled) Q with softmax_scale=1.0 folded in (times
  sqrt(512)) and packed, divided back for MaxText's scale-1 softmax."""
  root = math.sqrt(512)
  return dequantized(q * root) / root


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("backend", ["reference", "host"])
def test_attention_alone_matches_maxtexts_attention_op(runs, ratio, backend):
  """At every step, jax_mla.decode over the entries MaxText attends (the window and the
  compressed entries as two sources, the sinks, scale 1.0) equals MaxText's AttentionOp on the
  same cache entries dequantized from jax_mla's fp8 rows (and, on the host backend, the same
  fp8-rounded Q): only the bf16 output rounding differs."""
  run = runs[ratio]
  for step in range(STEPS):
    q = run.steps[step][2][0][0]
    theirs, *_ = replay(run, step, q=None if backend == "reference" else host_query(q))
    ours = jax_mla_attention(run, step, backend=backend)
    assert rel_l2(ours, theirs) < 4e-3, (step, rel_l2(ours, theirs))


@pytest.mark.parametrize("ratio", [4])
def test_the_scale_and_sink_conventions(runs, ratio):
  """MaxText folds head_dim ** -0.5 into Q (compressed_query_projection) and runs its softmax at
  scale 1, so jax_mla's default scale 1/sqrt(512) would apply it twice; the sink is a per-head
  logit in the denominator (MaxText's prefill pass carries it, its AR pass not: counted once),
  without which the result differs."""
  run = runs[ratio]
  step = STEPS - 1
  theirs, *_ = replay(run, step)
  assert rel_l2(jax_mla_attention(run, step, backend="reference"), theirs) < 4e-3
  assert rel_l2(jax_mla_attention(run, step, backend="reference", softmax_scale=None),
                theirs) > 0.05
  assert rel_l2(jax_mla_attention(run, step, backend="reference", sink=False), theirs) > 0.05


def test_rope_is_the_trailing_64_dims():
  """MaxText's V4 RoPE (DeepSeekV4RotaryEmbedding: interleaved pairs) rotates dims 448..511 only,
  which are jax_mla's bf16 RoPE part: rows go to pack_rows as MaxText holds them."""
  rope = embeddings.DeepSeekV4RotaryEmbedding(head_dim=512, partial_rotary_factor=64 / 512,
                                              rope_theta=10000.0)
  x = jax.random.normal(jax.random.key(0), (1, 3, 512), jnp.float32)
  y = rope(x, jnp.array([[5, 17, 40]]), unsqueeze_dim=None)
  np.testing.assert_array_equal(np.asarray(y[..., :448]), np.asarray(x[..., :448]))
  assert not np.allclose(np.asarray(y[..., 448:]), np.asarray(x[..., 448:]))


# ---- end to end ------------------------------------------------------------------------------

# (kv_format, backend, tolerance): bf16 rows are the model's values rounded once; fp8 rows and
# the host kernel's fp8 Q add the packed format's quantization (about 3-5 % here).
FORMATS = [("bf16", "reference", 1e-2), ("fp8", "host", 8e-2), ("bf16", "host", 8e-2)]


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("kv_format,backend,tolerance", FORMATS)
def test_end_to_end_matches_maxtexts_forward(runs, tokens, ratio, kv_format, backend, tolerance):
  """The layer's output over 9 decode steps (crossing CSA and HCA block boundaries, the
  indexer's top-3 choosing among up to 5 blocks) equals MaxText's full-sequence forward of the
  same layer at those positions: the model's window, sinks, compressed entries and top-k."""
  run = runs[ratio]
  outs, _ = run_decoder(run, tokens, kv_format=kv_format, backend=backend)
  errors = [rel_l2(out, run.full[:, PROMPT + s]) for s, out in enumerate(outs)]
  assert max(errors) < tolerance, errors


def test_csa_block_zero_made_while_decoding(setup, runs, tokens):
  """A prompt shorter than a block: CSA block 0 is made by the decode step of its last token,
  with no overlap prior (MaxText's AR path gives an all-zero prior gate -inf)."""
  run = runs[4]
  outs, _ = run_decoder(run, tokens, kv_format="bf16", backend="reference", prompt=2)
  errors = [rel_l2(out, run.full[:, 2 + s]) for s, out in enumerate(outs)]
  assert max(errors) < 1e-2, errors


# ---- the integration's lists against MaxText's --------------------------------------------

def window_rows(inputs):
  """The window list's pool rows (batch 1: the ring slots)."""
  w = inputs.window
  return np.asarray(w.kv_indices[:int(w.kv_indptr[1])])


@pytest.mark.parametrize("ratio", RATIOS)
def test_window_edges(runs, tokens, ratio):
  """The integration's window at position p is p - W + 1 .. p: W tokens, the current one
  included (MaxText's `0 <= p - k < W`), as ring slots `k % W`."""
  _, inputs = run_decoder(runs[ratio], tokens, kv_format="fp8", backend="host")
  for step, step_inputs in enumerate(inputs):
    p = PROMPT + step
    expected = [k % WINDOW for k in range(p, p - WINDOW, -1)]
    assert window_rows(step_inputs).tolist() == expected


def maxtext_blocks(run, step):
  """The compressed entries MaxText attends at `step`: (blocks, zeroed), the block numbers of the
  attended columns and those of them whose entry MaxText has overwritten with zeros. Its
  compressed index space is [prefill region: max(1, P // r) slots | AR region, a ring]."""
  _, ar_mask, (_, kwargs, _), _ = run.steps[step]
  region = max(1, PROMPT // run.ratio)
  ring = ar_ring(run.ratio, step)
  cols = np.nonzero(ar_mask[ar_cache_len(run):] > -1)[0]
  blocks, zeroed = [], []
  for c in cols:
    block, is_zero = (int(c), False) if c < region else ring[int(c) - region]
    blocks.append(block)
    if is_zero:
      zeroed.append(block)
      assert not np.any(np.asarray(kwargs["compressed_kv"][0, c])), "the entry should be zeros"
  return sorted(blocks), zeroed


def ar_ring(ratio, step):
  """MaxText 0.2.5's AR compressed ring after decode step `step` (kv_cache_autoregressive_v4):
  R = max(P // r + 1, T // r) - P // r slots (T = max_target_length), slot -> (block, zeroed).
  A step that completes a block writes it at the ring index and advances the index; any other
  step writes a zero entry there without advancing. Its validity mask counts the ring's blocks
  (cache lengths), not what the slots hold. Once the ring is full the index is back on the oldest
  block, so the next step that completes none overwrites that block with zeros, still valid."""
  prefill_region = max(1, PROMPT // ratio)
  slots = max(prefill_region + 1, (PROMPT + STEPS) // ratio) - prefill_region
  ring, index = [(None, True)] * slots, 0
  for p in range(PROMPT, PROMPT + step + 1):
    if (p + 1) % ratio == 0:
      ring[index], index = ((p + 1) // ratio - 1, False), (index + 1) % slots
    else:
      ring[index] = (ring[index][0], True)
  return ring


@pytest.mark.parametrize("ratio", [4, 8])
def test_compressed_entries_match_maxtexts(runs, tokens, ratio):
  """The integration's compressed list at every step: on HCA every completed block, visible from
  its last token's step on; on CSA the indexer's top-k (k = min(topk, blocks)) over the completed
  blocks. MaxText attends the same blocks while its AR ring has room. With T = 21 not a multiple
  of r its ring fills before the last step, and the next step that completes no block overwrites
  the oldest decoded block with zeros, which stays valid: HCA attends a zero key (logit 0, value
  0) in its place from position 16 on; CSA's indexer scores it 0 (position 20). The integration
  keeps every block."""
  run = runs[ratio]
  _, inputs = run_decoder(run, tokens, kv_format="fp8", backend="host")
  topk = SHAPE["indexer_topk"]
  zeroed_steps = []
  for step, step_inputs in enumerate(inputs):
    extra = step_inputs.extra
    ours = sorted(np.asarray(extra.kv_indices[:int(extra.kv_indptr[1])]).tolist())
    blocks = (PROMPT + step + 1) // ratio
    assert ours == list(range(blocks)) if ratio == 8 else len(ours) == min(topk, blocks)
    theirs, zeroed = maxtext_blocks(run, step)
    lost = [b for b, is_zero in ar_ring(ratio, step) if is_zero and b is not None]
    if not lost:
      assert theirs == ours, step
    else:
      zeroed_steps.append(PROMPT + step)
      assert len(theirs) == len(ours), step
      if ratio == 8:   # every valid column is attended, the zeroed one too
        assert theirs == ours and zeroed == lost, step
  assert zeroed_steps == ([16, 17, 18, 19, 20] if ratio == 8 else [20])
