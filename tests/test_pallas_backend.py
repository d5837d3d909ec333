"""backend="pallas" of `jax_mla.decode` and `decode_persistent`: which kernel serves which
device, the errors where none does, and the whole public path against the float64 oracle.

On the CPU the public path runs with the Triton kernel in Pallas interpret mode (the kernel
choice swapped in), and the Mosaic route is checked by lowering it for CUDA. On a GPU (marked
`gpu`) the same calls run compiled with the device's own kernel."""

import dataclasses
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mla
from support.compare import assert_bf16_decode_close
from support.gpu_export import export_for
from jax_mla._src.pallas import backend as pallas_backend
from support.oracle import oracle_decode
from support.rows import make_batch

ON_GPU = jax.default_backend() in ("gpu", "cuda", "rocm")
GPU = [pytest.mark.gpu, pytest.mark.skipif(
    not ON_GPU, reason=f"needs a CUDA or ROCm GPU; the default backend is "
    f"{jax.default_backend()!r}")]


@dataclasses.dataclass
class FakeDevice:
  platform: str
  compute_capability: str | None = None


@pytest.mark.parametrize("device,kernel", [
    (FakeDevice("cuda", "9.0"), "mosaic"),
    (FakeDevice("cuda", "8.0"), "triton"),
    (FakeDevice("cuda", "10.0"), "triton"),
    (FakeDevice("cuda"), "triton"),
    (FakeDevice("rocm"), "triton"),
    (FakeDevice("cpu"), None),
    (FakeDevice("tpu"), None),
])
def test_kernel_for_each_device(device, kernel):
  assert pallas_backend.kernel_for(device)[0] == kernel


def test_on_the_cpu_both_apis_say_why_they_cannot_run():
  batch = make_batch(np.random.default_rng(1), num_heads=128, lengths=[3, 0], sink=0.2)
  with pytest.raises(RuntimeError, match="backend='pallas' cannot run: the default device is "
                     "'cpu'; backend='pallas' needs a CUDA or ROCm GPU"):
    jax_mla.decode(*batch.args(), backend="pallas")
  workspace = jax_mla.make_workspace(max_rows=2)
  with pytest.raises(RuntimeError, match="backend='pallas' cannot run"):
    jax_mla.decode_persistent(*batch.args(), workspace, backend="pallas")


@pytest.mark.parametrize("device,picked", [
    (FakeDevice("cuda", "9.0"), "pallas"), (FakeDevice("cuda", "8.0"), "pallas"),
    (FakeDevice("rocm"), "pallas"), (FakeDevice("cpu"), None)])
def test_auto_picks_it_on_gpus_without_the_gfx950_kernels(monkeypatch, device, picked):
  from jax_mla._src import backends  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(jax, "devices", lambda *a: [device])
  monkeypatch.setattr(backends, "gfx950_available", lambda: (False, "not a gfx950"))
  backend, why = backends.explain_auto()
  if picked is None:  # the CPU: the host backend, or the reference without the extension
    assert backend in ("host", "reference"), why
  else:
    assert backend == picked and "not a gfx950" in why, why


def test_auto_prefers_the_gfx950_kernels(monkeypatch):
  from jax_mla._src import backends  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(jax, "devices", lambda *a: [FakeDevice("rocm")])
  monkeypatch.setattr(backends, "gfx950_available", lambda: (True, "verified"))
  assert backends.explain_auto() == ("gfx950", "verified")


@pytest.fixture(params=["interpret", pytest.param("gpu", marks=GPU)])
def mode(request, monkeypatch):
  """interpret: the Triton kernel in Pallas interpret mode stands in for the device's kernel."""
  if request.param == "interpret":
    monkeypatch.setattr(pallas_backend, "device_kernel", lambda: ("triton", "interpret mode"))
    monkeypatch.setattr(pallas_backend, "_interpret", lambda: True)
  return request.param


def check(batch, out, lse):
  out = np.asarray(jnp.asarray(out, jnp.float32))
  assert_bf16_decode_close(out, np.asarray(lse),
                           *oracle_decode(*batch.args(), batch.tokens_per_seq))


@pytest.mark.parametrize("num_heads,tokens_per_seq", [(8, 1), (16, 1), (16, 2), (16, 4), (32, 1),
                                                     (64, 1), (128, 1)])
def test_decode_matches_the_oracle(mode, num_heads, tokens_per_seq):
  del mode
  rng = np.random.default_rng(num_heads + tokens_per_seq)
  # An empty row, rows shorter than a KV block, one over two blocks; a sink per head.
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                     lengths=[5, 0, 150, 1], sink=0.3, extra_indices=7)
  decode = jax.jit(lambda *a: jax_mla.decode(*a, tokens_per_seq=tokens_per_seq,
                                             backend="pallas"))
  check(batch, *decode(*batch.args()))


@pytest.mark.parametrize("num_kv_splits", [1, 3])
def test_decode_splits_and_no_lse(mode, num_kv_splits):
  del mode
  batch = make_batch(np.random.default_rng(7), num_heads=64, lengths=[200, 2, 0], sink=-1.0)
  out, lse = jax_mla.decode(*batch.args(), num_kv_splits=num_kv_splits, backend="pallas")
  check(batch, out, lse)
  out_only, none = jax_mla.decode(*batch.args(), num_kv_splits=num_kv_splits,
                                  backend="pallas", return_lse=False)
  assert none is None
  np.testing.assert_array_equal(np.asarray(out_only), np.asarray(out))


def test_persistent_api_runs_and_returns_the_workspace_unchanged(mode):
  del mode
  batch = make_batch(np.random.default_rng(3), num_heads=128, lengths=[70, 0, 3], sink=0.5)
  workspace = jax_mla.make_workspace(max_rows=4)
  out, lse, returned = jax_mla.decode_persistent(*batch.args(), workspace, backend="pallas")
  check(batch, out, lse)
  # The same arrays, not copies (the container is rebuilt by the API's forward-only wrapper).
  assert jax.tree.structure(returned) == jax.tree.structure(workspace)
  assert all(a is b for a, b in zip(jax.tree.leaves(returned), jax.tree.leaves(workspace)))


def test_persistent_api_with_no_rows_gives_empty_results(mode):
  del mode
  batch = make_batch(np.random.default_rng(4), num_heads=128, lengths=[], sink=0.1)
  workspace = jax_mla.make_workspace(max_rows=4)
  out, lse, _ = jax_mla.decode_persistent(*batch.args(), workspace, backend="pallas")
  assert out.shape == (0, 128, 512) and out.dtype == jnp.bfloat16
  assert lse.shape == (0, 128) and lse.dtype == jnp.float32


def test_the_mosaic_route_lowers_for_cuda_from_the_cpu(monkeypatch):
  monkeypatch.setattr(pallas_backend, "device_kernel", lambda: ("mosaic", "lowering only"))
  batch = make_batch(np.random.default_rng(5), num_heads=128, lengths=[5, 0, 150], sink=0.3)
  shapes = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in batch.args()]
  exported = export_for(lambda *a: jax_mla.decode(*a, backend="pallas"), "cuda", *shapes,
                        custom_calls=["mosaic_gpu_v2"])
  assert "mosaic_gpu" in exported.mlir_module()


def test_the_triton_route_lowers_for_rocm_from_the_cpu(monkeypatch):
  monkeypatch.setattr(pallas_backend, "device_kernel", lambda: ("triton", "interpret mode"))
  batch = make_batch(np.random.default_rng(6), num_heads=64, lengths=[5, 9], sink=0.3)
  shapes = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in batch.args()]
  exported = export_for(lambda *a: jax_mla.decode(*a, backend="pallas"), "rocm", *shapes,
                        custom_calls=["__gpu$xla.gpu.triton"])
  assert "__gpu$xla.gpu.triton" in exported.mlir_module()


def test_one_executable_serves_every_set_of_lengths(mode):
  rng = np.random.default_rng(9)
  traces = []
  if mode == "interpret":  # its first run imports jax modules that define config options
    jax_mla.decode(*make_batch(rng, num_heads=64, lengths=[1]).args(), backend="pallas")

  def decode(*args):
    traces.append(1)
    return jax_mla.decode(*args, backend="pallas")

  jitted = jax.jit(decode)
  for lengths in ([10, 20, 30], [0, 0, 60], [59, 1, 0]):  # same total: same index-list shape
    batch = make_batch(rng, num_heads=64, lengths=lengths, sink=0.0)
    check(batch, *jitted(*batch.args()))
  assert len(traces) == 1


def test_a_jitted_caller_traces_once_though_the_first_decode_loads_the_kernels():
  """The Pallas backend's modules load on the first decode, inside the caller's trace; what
  they import must not change jax's config (its trace caches' key), or the caller's jitted
  function traces and compiles again on its next call. A fresh process: here other tests have
  loaded them already."""
  script = textwrap.dedent("""
      import jax, jax_mla
      traces = []

      @jax.jit
      def step(x):
        traces.append(1)
        from jax_mla._src.pallas import triton  # what the first decode imports
        from jax_mla._src.pallas.mosaic import decode
        return x + 1

      step(1.0)
      step(2.0)
      print(len(traces))
      """)
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        check=False, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split() == ["1"]


def test_check_indices_names_the_bad_entry_before_the_kernel_runs(mode):
  del mode
  from jax.experimental import checkify  # pylint: disable=import-outside-toplevel
  batch = make_batch(np.random.default_rng(8), num_heads=64, lengths=[4, 6], sink=0.2)
  batch.kv_indices = batch.kv_indices.copy()
  batch.kv_indices[7] = batch.kv.shape[0]  # one past the pool
  with pytest.raises(checkify.JaxRuntimeError, match=r"kv_indices\[7\] = "):
    jax_mla.decode(*batch.args(), backend="pallas", check_indices=True)


def test_vmap_equals_the_unbatched_calls(mode):
  """jax.vmap over whole decode problems (Pallas's batching rule adds a grid axis)."""
  del mode
  from support.rows import equal_width_batches  # pylint: disable=import-outside-toplevel
  batches = equal_width_batches(np.random.default_rng(0), 2, num_heads=64,
                                lengths=([3, 0, 40], [70, 1, 0]), pool_rows=48, sink=0.5,
                                extra=3)
  fields = ("q", "q_rope", "kv", "kv_rope", "kv_indptr", "kv_indices")
  stacked = [np.stack([getattr(b, f) for b in batches]) for f in fields]
  decode = lambda *a: jax_mla.decode(*a, backend="pallas", num_kv_splits=2)
  out, lse = jax.jit(jax.vmap(decode, in_axes=(0,) * 6 + (None,)))(*stacked, batches[0].sink)
  assert np.isfinite(np.asarray(out, np.float32)).all()
  for i, batch in enumerate(batches):
    want_out, want_lse = jax.jit(decode)(*batch.args())
    np.testing.assert_array_equal(np.asarray(out[i], np.float32),
                                  np.asarray(want_out, np.float32))
    np.testing.assert_array_equal(np.asarray(lse[i]), np.asarray(want_lse))
    check(batch, out[i], lse[i])


# --- Q as the model holds it: bf16/f32 [T, H, 512], q_rope None ("float_q" is native) -----------

def float_q(batch, rng, dtype):
  """The batch's Q values moved off the fp8 grid, as `dtype`; and the values the kernels
  compute with (bf16 as given, f32 rounded to bf16), float64."""
  from support.oracle import dequantize_rows  # pylint: disable=import-outside-toplevel
  values = dequantize_rows(batch.q, batch.q_rope)
  q = jnp.asarray(values * (1 + 0.2 * rng.standard_normal(values.shape)), jnp.dtype(dtype))
  return q, np.asarray(q.astype(jnp.bfloat16).astype(jnp.float32), np.float64)


def test_float_q_is_native():
  from jax_mla._src import backends  # pylint: disable=import-outside-toplevel
  assert "float_q" in backends.REGISTRY["pallas"].native


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("num_heads,tokens_per_seq", [(8, 1), (16, 4), (128, 1)])
def test_decode_takes_float_q_as_given(mode, dtype, num_heads, tokens_per_seq):
  """The public API hands bf16/f32 Q to the kernel unpacked: the oracle on its values (f32
  rounded to bf16), not on fp8-packed Q."""
  del mode
  from support.oracle import dequantize_rows, oracle_attend, token_keys  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(11 + num_heads)
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                     lengths=[5, 0, 150, 1], sink=0.3, extra_indices=7)
  q, computed = float_q(batch, rng, dtype)
  decode = jax.jit(lambda q, *a: jax_mla.decode(q, None, *a, tokens_per_seq=tokens_per_seq,
                                                backend="pallas"))
  out, lse = decode(q, *batch.args()[2:])
  keys = token_keys(dequantize_rows(batch.kv, batch.kv_rope), batch.kv_indptr, batch.kv_indices,
                    computed.shape[0], tokens_per_seq)
  assert_bf16_decode_close(np.asarray(jnp.asarray(out, jnp.float32)), np.asarray(lse),
                           *oracle_attend(computed, keys, batch.sink, 1 / np.sqrt(512)))


@pytest.mark.parametrize("kernel,platform,custom_call", [
    ("mosaic", "cuda", "mosaic_gpu_v2"), ("triton", "cuda", "__gpu$xla.gpu.triton"),
    ("triton", "rocm", "__gpu$xla.gpu.triton")])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_float_q_reaches_the_kernel_without_xla_passes(monkeypatch, kernel, platform,
                                                       custom_call, dtype):
  """jax_mla.decode with bf16/f32 Q lowers to the kernel call alone: Q is not packed (no fp8
  conversion, no per-tile max) nor converted before it (the H200 spent 30-45% more time on a
  decode given bf16 Q when the API packed it)."""
  monkeypatch.setattr(pallas_backend, "device_kernel", lambda: (kernel, "lowering only"))
  batch = make_batch(np.random.default_rng(12), num_heads=128, lengths=[5, 0, 150], sink=0.3)
  shapes = [jax.ShapeDtypeStruct(batch.q.shape, jnp.dtype(dtype)), None] + [
      jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in batch.args()[2:]]
  text = export_for(lambda *a: jax_mla.decode(*a, backend="pallas", num_kv_splits=1), platform,
                    *shapes, custom_calls=[custom_call]).mlir_module()
  lines = text.splitlines()
  assert len([line for line in lines if custom_call in line]) == 1
  # The XLA ops around the kernel call (the call's own line holds the kernel's serialized IR).
  outside = "\n".join(line.split(" loc(")[0] for line in lines
                      if custom_call not in line and not line.startswith("#loc"))
  assert "f8E4M3" not in outside and "stablehlo.reduce" not in outside, (
      "Q was packed before the kernel")
  assert "stablehlo.convert %arg0" not in outside, "Q was converted before the kernel"


# --- Pools as servers keep them: bf16/f32 [R, 512], kv_rope None ("float_kv" is native) ---------

def float_pool(batch, dtype):
  """The batch's pool values moved off the fp8 grid, as `dtype` [R, 512]; and the values the
  kernels compute with (bf16 as given, f32 rounded to bf16), float64."""
  from support.oracle import dequantize_rows  # pylint: disable=import-outside-toplevel
  values = dequantize_rows(batch.kv, batch.kv_rope)
  rng = np.random.default_rng(0)
  kv = jnp.asarray(values * (1 + 0.2 * rng.standard_normal(values.shape)), jnp.dtype(dtype))
  return kv, np.asarray(kv.astype(jnp.bfloat16).astype(jnp.float32), np.float64)


def test_float_kv_is_native():
  from jax_mla._src import backends  # pylint: disable=import-outside-toplevel
  assert "float_kv" in backends.REGISTRY["pallas"].native


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("num_heads,tokens_per_seq", [(8, 1), (16, 4), (128, 1)])
def test_decode_takes_float_pools_as_given(mode, dtype, num_heads, tokens_per_seq):
  """The public API hands a bf16/f32 pool (with a packed second source) to the kernel
  unpacked: the oracle on its values (f32 rounded to bf16), not on fp8-packed rows."""
  del mode
  from support.oracle import dequantize_rows, oracle_attend, token_keys  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(21 + num_heads)
  batch = make_batch(rng, num_heads=num_heads, tokens_per_seq=tokens_per_seq,
                     lengths=[5, 0, 150, 1], sink=0.3, extra_indices=7)
  second = make_batch(rng, num_heads=1, lengths=[0, 9, 70, 3], pool_rows=64)
  kv, computed = float_pool(batch, dtype)
  extra = jax_mla.KVSource(second.kv, second.kv_rope, second.kv_indptr, second.kv_indices)
  decode = jax.jit(lambda kv, *a: jax_mla.decode(
      a[0], a[1], kv, None, *a[2:], tokens_per_seq=tokens_per_seq, backend="pallas",
      extra=extra))
  out, lse = decode(kv, batch.q, batch.q_rope, *batch.args()[4:])
  num_tokens = batch.q.shape[0]
  keys = [np.concatenate([a, b]) for a, b in zip(
      token_keys(computed, batch.kv_indptr, batch.kv_indices, num_tokens, tokens_per_seq),
      token_keys(dequantize_rows(second.kv, second.kv_rope), second.kv_indptr,
                 second.kv_indices, num_tokens, tokens_per_seq))]
  want = oracle_attend(dequantize_rows(batch.q, batch.q_rope), keys, batch.sink,
                       1 / np.sqrt(512))
  out = np.asarray(jnp.asarray(out, jnp.float32))
  assert np.isfinite(out).all() and np.isfinite(np.asarray(lse)).all()
  assert_bf16_decode_close(out, np.asarray(lse), *want)


@pytest.mark.parametrize("kernel,platform,custom_call", [
    ("mosaic", "cuda", "mosaic_gpu_v2"), ("triton", "cuda", "__gpu$xla.gpu.triton"),
    ("triton", "rocm", "__gpu$xla.gpu.triton")])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_float_pools_reach_the_kernel_without_xla_passes(monkeypatch, kernel, platform,
                                                         custom_call, dtype):
  """jax_mla.decode with bf16/f32 pools in both sources lowers to the kernel call alone: no
  gather of the listed rows and no packing before it (f32 pools on the Triton kernel: their
  listed rows in bf16) (the H200 spent 32-82% more time on a
  decode whose bf16 window pool the API packed: benchmarks/results/h200_2026-12-04/
  two_sources*.json)."""
  monkeypatch.setattr(pallas_backend, "device_kernel", lambda: (kernel, "lowering only"))
  batch = make_batch(np.random.default_rng(22), num_heads=128, lengths=[5, 0, 150], sink=0.3)
  pool = jax.ShapeDtypeStruct((batch.kv.shape[0], 512), jnp.dtype(dtype))
  pool2 = jax.ShapeDtypeStruct((77, 512), jnp.dtype(dtype))
  lists = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in batch.args()[4:6]]
  shapes = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in batch.args()[:2]]
  sink = jax.ShapeDtypeStruct((128,), jnp.float32)
  text = export_for(lambda q, q_rope, kv, indptr, indices, sink, kv2, indptr2, indices2:
                    jax_mla.decode(q, q_rope, kv, None, indptr, indices, sink, backend="pallas",
                                   num_kv_splits=1,
                                   extra=jax_mla.KVSource(kv2, None, indptr2, indices2)),
                    platform, *shapes, pool, *lists, sink, pool2, *lists,
                    custom_calls=[custom_call]).mlir_module()
  lines = text.splitlines()
  calls = [line for line in lines if custom_call in line]
  assert len(calls) == 1
  outside = [line.split(" loc(")[0] for line in lines
             if custom_call not in line and not line.startswith("#loc")]
  element = {"bfloat16": "bf16", "float32": "f32"}[dtype]
  if kernel == "triton" and dtype == "float32":
    # Triton's f32 tiles overflow shared memory: XLA rounds the listed rows to bf16 first.
    listed = f"tensor<{lists[1].shape[0]}x512xbf16>"
    assert calls[0].count(listed) == 2 and "x512xf32>" not in calls[0], calls[0]
    return
  for rows in (batch.kv.shape[0], 77):
    pool_type = f"tensor<{rows}x512x{element}>"
    assert pool_type in calls[0]
    readers = [line for line in outside if pool_type in line and "func.func" not in line]
    assert not readers, f"the pool is read before the kernel: {readers[:2]}"
  assert not any("f8E4M3" in line for line in outside), "a pool was packed before the kernel"
