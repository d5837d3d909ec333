"""The persistent primitive's lowerings, read from StableHLO: the rocm export carries exactly one
custom call to jax_mla_persistent_decode_v1 with the workspace aliases and the attributes, and
nothing else but the empty-row fix-up; the cpu lowering carries its extra attribute; other
platforms are refused with a pointer to the reference backend."""

import re

import jax
import jax.numpy as jnp
import pytest

from jax_mla._src.aiter.persistent import TARGET, decode_persistent
from jax_mla._src.workspace import make_workspace

N, P, ROWS, L = 3, 8, 20, 8
# What the fix-up (scatter on the uint16 bits of out, select on lse) and slicing of kv_indptr may
# emit, plus module structure. Anything else would be extra work around the kernel.
ALLOWED_OPS = {"custom_call", "slice", "compare", "iota", "select", "broadcast_in_dim",
               "bitcast_convert", "scatter", "add", "constant", "return"}


def shapes(n=N):
  s = jax.ShapeDtypeStruct
  return (s((n, 128, 512), jnp.uint8), s((n, 128, 64), jnp.bfloat16), s((ROWS, 512), jnp.uint8),
          s((ROWS, 64), jnp.bfloat16), s((n + 1,), jnp.int32), s((L,), jnp.int32),
          s((128,), jnp.float32))


def export_text(platform, backend, **kwargs):
  ws = jax.eval_shape(lambda: make_workspace(P, 16))
  f = jax.jit(lambda ws, *a: decode_persistent(*a, ws, backend=backend, **kwargs))
  exp = jax.export.export(f, platforms=[platform], disabled_checks=[
      jax.export.DisabledSafetyCheck.custom_call(TARGET)])(ws, *shapes())
  return exp.mlir_module()


def custom_calls(text):
  return [l for l in text.splitlines() if "stablehlo.custom_call" in l]


def ops(text):
  return set(re.findall(r"(?<![#\w])stablehlo\.(\w+)", text))  # ops, not #stablehlo attributes


@pytest.mark.parametrize("return_lse", [True, False])
def test_rocm_export(return_lse):
  text = export_text("rocm", "gfx950", return_lse=return_lse)
  calls = custom_calls(text)
  assert len(calls) == 1, calls
  call = calls[0]
  assert f"@{TARGET}(" in call
  attrs = re.search(r"mhlo.backend_config = \{(.*?)\}", call).group(1)
  assert attrs == f"num_partitions = {P} : i32, return_lse = {str(return_lse).lower()}"
  aliases = re.findall(r"output_tuple_indices = \[(\d+)\], operand_index = (\d+)", call)
  assert sorted((int(o), int(i)) for i, o in aliases) == [(7, 2), (8, 3), (9, 4), (10, 5),
                                                         (11, 6)]
  lse_rows = N if return_lse else 0
  assert (f"-> (tensor<{N}x128x512xbf16>, tensor<{lse_rows}x128xf32>, tensor<16x128x512xf32>, "
          "tensor<16x128xf32>, tensor<8x8xi32>, tensor<143360xui32>, tensor<17xi32>)") in call
  assert "has_side_effect" not in call
  extra = ops(text) - ALLOWED_OPS
  assert not extra, f"unexpected ops around the kernel: {extra}"
  assert text.count('"stablehlo.scatter"') == 1
  # The fix-up never touches o_acc or any other workspace buffer; no full-size select on out.
  assert not re.search(rf"stablehlo.select .*tensor<{N}x128x512x", text)


def test_cpu_lowering_adds_the_host_attribute_and_uses_a_select():
  text = export_text("cpu", "host")
  (call,) = custom_calls(text)
  attrs = re.search(r"mhlo.backend_config = \{(.*?)\}", call).group(1)
  assert attrs == f"fill_unwritten_nan = false, num_partitions = {P} : i32, return_lse = true"
  assert '"stablehlo.scatter"' not in text


@pytest.mark.parametrize("platform,backend", [("cpu", "gfx950"), ("rocm", "host"),
                                              ("cuda", "host"), ("tpu", "gfx950")])
def test_wrong_platform_is_refused(platform, backend):
  with pytest.raises(NotImplementedError, match="backend|reference"):
    export_text(platform, backend)


def test_unsupported_platform_points_to_the_reference():
  ws = jax.eval_shape(lambda: make_workspace(P, 16))
  f = jax.jit(lambda ws, *a: decode_persistent(*a, ws, backend="host"))
  with pytest.raises(NotImplementedError, match=r"backend='reference'"):
    f.trace(ws, *shapes()).lower(lowering_platforms=("cuda",))
