"""What the split path lowers to, read from jax.export for rocm (no GPU needed), plus recompile
and argument checks."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mla

from support.rows import make_batch
from jax_mla._src.aiter import split as split_kernel
from jax_mla._src.aiter.split import split_decode

TARGET = "jax_mla_split_decode_v1"


def specs(num_seqs, heads, msq=1, kv_rows=50, num_indices=77):
  t = num_seqs * msq
  return (jax.ShapeDtypeStruct((t, heads, 512), jnp.uint8),
          jax.ShapeDtypeStruct((t, heads, 64), jnp.bfloat16),
          jax.ShapeDtypeStruct((kv_rows, 512), jnp.uint8),
          jax.ShapeDtypeStruct((kv_rows, 64), jnp.bfloat16),
          jax.ShapeDtypeStruct((num_seqs + 1,), jnp.int32),
          jax.ShapeDtypeStruct((num_indices,), jnp.int32),
          jax.ShapeDtypeStruct((heads,), jnp.float32))


def export_text(fn, args, platform="rocm"):
  exported = jax.export.export(
      jax.jit(fn), platforms=[platform],
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(TARGET)])(*args)
  return exported.mlir_module()


CALL = re.compile(r"stablehlo\.custom_call @(\w+)\((.*?)\) \{(.*)\} : \((.*?)\) -> (.*?)(?: loc\(|$)")


def custom_calls(text):
  calls = []
  for line in text.splitlines():
    if "stablehlo.custom_call" not in line:
      continue
    m = CALL.search(line)
    assert m, f"unparsed custom call: {line}"
    target, _, attrs, operands, results = m.groups()
    config = re.search(r"mhlo\.backend_config = \{(.*?)\}", attrs)
    calls.append(dict(target=target, attrs=attrs,
                      config=dict(re.findall(r"(\w+) = ([^,]+)", config.group(1))) if config else None,
                      operands=re.findall(r"tensor<[^>]*>", operands),
                      results=re.findall(r"tensor<[^>]*>", results)))
  return calls


OPERANDS = ["tensor<{t}x{h}x512xui8>", "tensor<{t}x{h}x64xbf16>", "tensor<50x512xui8>",
            "tensor<50x64xbf16>", "tensor<{b1}xi32>", "tensor<77xi32>", "tensor<{h}xf32>",
            "tensor<{b1}xi32>", "tensor<{b1}xi32>"]


@pytest.mark.parametrize("heads,msq", [(16, 1), (16, 4), (128, 1), (8, 1)])
@pytest.mark.parametrize("num_kv_splits", [1, 4])
def test_rocm_lowering_is_one_typed_ffi_call(heads, msq, num_kv_splits):
  num_seqs = 3
  fn = functools.partial(split_decode, tokens_per_seq=msq, num_kv_splits=num_kv_splits,
                         backend="gfx950", return_lse=num_kv_splits > 1)
  text = export_text(fn, specs(num_seqs, heads, msq))
  calls = custom_calls(text)
  assert len(calls) == 1, [c["target"] for c in calls]  # no merge or fix-up custom calls
  (call,) = calls
  assert call["target"] == TARGET
  assert call["config"] == {"num_kv_splits": f"{num_kv_splits} : i32",
                            "tokens_per_seq": f"{msq} : i32"}
  assert "has_side_effect" not in call["attrs"]
  kh = max(heads, 16)  # 8 heads run padded to 16
  t, s = num_seqs * msq, num_kv_splits
  assert call["operands"] == [o.format(t=t, h=kh, b1=num_seqs + 1) for o in OPERANDS]
  if s == 1:
    assert call["results"] == [f"tensor<{t}x{kh}x512xbf16>"]
  else:
    assert call["results"] == [f"tensor<{t}x{s}x{kh}x512xf32>", f"tensor<{t}x{s}x{kh}xf32>",
                               f"tensor<{num_seqs}xi32>"]


def test_rocm_hlo_says_typed_ffi():
  fn = functools.partial(split_decode, tokens_per_seq=1, num_kv_splits=2, backend="gfx950")
  hlo = jax.jit(fn).trace(*specs(2, 16)).lower(lowering_platforms=("rocm",)).as_text(
      dialect="hlo")
  line = next(l for l in hlo.splitlines() if TARGET in l)
  assert "api_version=API_VERSION_TYPED_FFI" in line
  assert re.search(r"backend_config=\{num_kv_splits = 2 : i32, tokens_per_seq = 1 : i32\}", line)


@pytest.mark.parametrize("merge", [True, False])
@pytest.mark.parametrize("fill", [True, False])
def test_cpu_lowering_adds_the_host_attributes(fill, merge):
  fn = functools.partial(split_decode, tokens_per_seq=1, num_kv_splits=3, backend="host",
                         fill_unwritten_nan=fill, merge_in_executor=merge)
  (call,) = custom_calls(export_text(fn, specs(2, 32), platform="cpu"))
  assert call["target"] == TARGET
  assert call["config"] == {"fill_unwritten_nan": str(fill).lower(),
                            "merge_in_executor": str(merge).lower(), "num_kv_splits": "3 : i32",
                            "tokens_per_seq": "1 : i32"}


def test_backend_platform_mismatches_are_explained():
  args = specs(2, 16)
  host_fn = functools.partial(split_decode, tokens_per_seq=1, num_kv_splits=2, backend="host")
  with pytest.raises(ValueError, match="backend='host' cannot run on rocm"):
    export_text(host_fn, args, "rocm")
  gfx_fn = functools.partial(split_decode, tokens_per_seq=1, num_kv_splits=2, backend="gfx950")
  with pytest.raises(ValueError, match="backend='gfx950' needs a ROCm gfx950 device; this "
                                       "computation is lowered for cpu"):
    jax.jit(gfx_fn).lower(*args)
  with pytest.raises(NotImplementedError, match="backend='reference'"):
    export_text(gfx_fn, args, "cuda")


def test_one_executable_serves_every_kv_length():
  traces = []

  def fn(*args):
    traces.append(1)
    return split_decode(*args, tokens_per_seq=1, num_kv_splits=None, backend="host")

  jitted = jax.jit(fn)
  rng = np.random.default_rng(0)
  for lengths in ([3, 0, 40], [100, 7, 1], [0, 0, 0], [32, 64, 96]):
    batch = make_batch(rng, num_heads=16, lengths=lengths, pool_rows=64)
    # Same shapes every call: kv_indices padded to a fixed capacity.
    indices = np.zeros(200, np.int32)
    indices[:len(batch.kv_indices)] = batch.kv_indices
    out, lse = jitted(batch.q, batch.q_rope, batch.kv, batch.kv_rope, batch.kv_indptr, indices,
                      np.full(16, -np.inf, np.float32))
    assert np.isfinite(np.asarray(out.astype(jnp.float32))).all()
  assert len(traces) == 1
  assert jitted._cache_size() == 1  # pylint: disable=protected-access


@pytest.mark.parametrize("heads,msq", [(32, 2), (24, 1), (256, 1), (8, 8)])
def test_unsupported_shapes_raise_before_lowering(heads, msq):
  args = [np.zeros(s.shape, s.dtype) for s in specs(2, heads, msq)]
  with pytest.raises(ValueError, match=rf"backend='host' serves \(num_heads, tokens_per_seq\) in "
                                       rf"\{{.*\(16, 4\).*\}}; got \({heads}, {msq}\)"):
    jax_mla.decode(*args, tokens_per_seq=msq, num_kv_splits=2, backend="host")


def test_the_cpp_plan_serves_the_manifests_layouts():
  """The served (heads, tokens) pairs have one home, the manifest's `serves`; the C++ plan's list
  is held to it."""
  from jax_mla._src import ext  # pylint: disable=import-outside-toplevel
  from jax_mla._src.aiter.code_objects import manifest  # pylint: disable=import-outside-toplevel
  text = ext.extension().split_supported_shapes()
  pairs = tuple(tuple(int(v) for v in p.split(",")) for p in re.findall(r"\((\d+,\d+)\)", text))
  assert pairs == manifest.kernel("mla_v4_nm").serves


@pytest.mark.parametrize("num_kv_splits,return_lse,error,match", [
    (0, True, ValueError, "num_kv_splits must be >= 1, got 0"),
    (-1, False, ValueError, "num_kv_splits must be >= 1"),
    (2.0, True, TypeError, "num_kv_splits must be an int"),
    ("2", True, TypeError, "num_kv_splits must be an int"),
    (True, True, TypeError, "num_kv_splits must be an int"),
])
@pytest.mark.parametrize("backend", ["host", "gfx950"])
def test_bad_split_arguments_raise_before_any_launch(num_kv_splits, return_lse, error, match,
                                                     backend, monkeypatch):
  monkeypatch.setattr(split_kernel.split_decode_p, "bind",
                      lambda *a, **k: pytest.fail("bound the primitive"))
  args = [np.zeros(s.shape, s.dtype) for s in specs(2, 16)]
  with pytest.raises(error, match=match):
    split_decode(*args, tokens_per_seq=1, num_kv_splits=num_kv_splits, backend=backend,
                 return_lse=return_lse)


@pytest.mark.parametrize("backend,merge", [("gfx950", None), ("host", False)])
def test_one_split_with_lse_needs_the_executor_merge(backend, merge, monkeypatch):
  """The nm kernel writes no LSE at one split: refused where XLA merges (gfx950, and the host
  with merge_in_executor=False); the host's executor merge writes one (test_split_host.py)."""
  monkeypatch.setattr(split_kernel.split_decode_p, "bind",
                      lambda *a, **k: pytest.fail("bound the primitive"))
  args = [np.zeros(s.shape, s.dtype) for s in specs(2, 16)]
  with pytest.raises(ValueError, match="num_kv_splits=1 with return_lse=True.*return_lse=False"):
    split_decode(*args, tokens_per_seq=1, num_kv_splits=1, backend=backend, return_lse=True,
                 merge_in_executor=merge)


def test_bad_backend_and_fill_options():
  args = [np.zeros(s.shape, s.dtype) for s in specs(2, 16)]
  with pytest.raises(ValueError, match="backend must be 'gfx950' or 'host', got 'reference'"):
    split_decode(*args, tokens_per_seq=1, num_kv_splits=2, backend="reference")
  with pytest.raises(ValueError, match="fill_unwritten_nan=True is only available"):
    split_decode(*args, tokens_per_seq=1, num_kv_splits=2, backend="gfx950",
                 fill_unwritten_nan=True)
  with pytest.raises(ValueError, match="merge_in_executor=True is only available"):
    split_decode(*args, tokens_per_seq=1, num_kv_splits=2, backend="gfx950",
                 merge_in_executor=True)


def test_auto_split_count_is_at_least_two_with_lse():
  # 256 sequences x 2 head groups fill the 256 CUs twice: the occupancy pick alone says 1.
  from jax_mla._src.aiter import planner  # pylint: disable=import-outside-toplevel
  assert planner.num_kv_splits(256, 128) == 1
  fn = functools.partial(split_decode, tokens_per_seq=1, num_kv_splits=None, backend="gfx950")
  (call,) = custom_calls(export_text(fn, specs(256, 128)))
  assert call["config"]["num_kv_splits"] == "2 : i32"
  fn = functools.partial(split_decode, tokens_per_seq=1, num_kv_splits=None, backend="gfx950",
                         return_lse=False)
  (call,) = custom_calls(export_text(fn, specs(256, 128)))
  assert call["config"]["num_kv_splits"] == "1 : i32"
