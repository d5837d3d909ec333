"""Hashes of the Mosaic GPU kernel's lowered module, for checking on a CPU that a refactor of the
kernel's IR emitters (pallas/mosaic/) lowers to the same module it did before.

The Mosaic kernel runs only on a Hopper GPU, but it lowers anywhere: this exports
`mosaic_decode` for CUDA (tests/support/gpu_export.py), takes the Mosaic module out of the
custom call, prints it without source locations and hashes the text. Same hashes before and
after a change: the change cannot alter what runs. Usage, from the repository root:

  PYTHONPATH=src python tools/mosaic_ir.py [--out FILE.json]    # then diff two runs' files
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import jax
import ml_dtypes
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.interpreters import mlir as jax_mlir
from jaxlib.mlir import ir

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from support.gpu_export import export_for  # noqa: E402  pylint: disable=wrong-import-position

from jax_mla._src.pallas.mosaic import decode as mosaic_decode  # noqa: E402  pylint: disable=wrong-import-position

SEQS, POOL, ENTRIES, EXTRA_ENTRIES = 2, 256, 302, 130
# name: (heads, Q dtype (None: packed), pool dtype (None: packed), a second source)
CONFIGS = {
    "unpaired": (64, None, None, False),
    "paired": (128, None, None, False),
    "paired_f32_q": (128, np.float32, None, False),
    "unpaired_bf16_q": (64, ml_dtypes.bfloat16, None, False),
    "unpaired_bf16_pool": (64, None, ml_dtypes.bfloat16, False),
    "paired_f32_pool": (128, None, np.float32, False),
    "unpaired_two_sources": (64, None, None, True),
    "paired_two_sources_bf16_pools": (128, None, ml_dtypes.bfloat16, True),
}


def _pool(dtype):
  if dtype is None:
    return (jax.ShapeDtypeStruct((POOL, 512), np.uint8),
            jax.ShapeDtypeStruct((POOL, 64), ml_dtypes.bfloat16))
  return jax.ShapeDtypeStruct((POOL, 512), dtype), None


def module_texts(heads, q_dtype=None, pool_dtype=None, two_sources=False):
  """The Mosaic modules (text, no locations) of one decode's lowering."""
  if q_dtype is None:
    q = (jax.ShapeDtypeStruct((SEQS, heads, 512), np.uint8),
         jax.ShapeDtypeStruct((SEQS, heads, 64), ml_dtypes.bfloat16))
  else:
    q = (jax.ShapeDtypeStruct((SEQS, heads, 512), q_dtype), None)
  lists = (jax.ShapeDtypeStruct((SEQS + 1,), np.int32), jax.ShapeDtypeStruct((ENTRIES,), np.int32))
  sink = jax.ShapeDtypeStruct((heads,), np.float32)
  extra = (*_pool(pool_dtype), jax.ShapeDtypeStruct((SEQS + 1,), np.int32),
           jax.ShapeDtypeStruct((EXTRA_ENTRIES,), np.int32)) if two_sources else ()

  def decode(q, q_rope, kv, kv_rope, indptr, indices, sink, *extra):
    return mosaic_decode.mosaic_decode(q, q_rope, kv, kv_rope, indptr, indices, sink,
                                       tokens_per_seq=1, num_kv_splits_=1,
                                       extra=tuple(extra) if extra else None)

  text = export_for(decode, "cuda", *q, *_pool(pool_dtype), *lists, sink, *extra,
                    custom_calls=["mosaic_gpu_v2"]).mlir_module()
  context = jax_mlir.make_ir_context()
  context.allow_unregistered_dialects = True  # the serialized form's stable_mosaic_gpu ops
  mgpu.dialect.register_dialect(context)  # its types, inside memrefs
  texts = []
  with context:
    def visit(op):
      if op.name == "stablehlo.custom_call" and "mosaic" in str(op.attributes["call_target_name"]):
        config = ir.DictAttr(op.attributes["mhlo.backend_config"])
        module = ir.Module.parse(ir.StringAttr(config["module"]).value_bytes)
        texts.append(module.operation.get_asm(enable_debug_info=False))
      for region in op.regions:
        for block in region.blocks:
          for inner in block.operations:
            visit(inner.operation)
    visit(ir.Module.parse(text).operation)
  return texts


def hashes(names=None):
  """{configuration: [sha256 of each Mosaic module], or "unparsed: <why>" where this jax's MLIR
  bindings did not parse the module back}."""
  result = {}
  for name in names or CONFIGS:
    try:
      texts = module_texts(*CONFIGS[name])
    except ir.MLIRError as error:  # jax 0.11.2's bindings reject Mosaic's #gpu<dim x>
      result[name] = "unparsed: " + str(error).splitlines()[1].strip()
      continue
    result[name] = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
  return result


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--out", default=None)
  args = parser.parse_args(argv)
  result = hashes()
  for name, value in result.items():
    print(f"{name}: {value}")
  if args.out:
    with open(args.out, "w") as out:
      json.dump(result, out, indent=1)


if __name__ == "__main__":
  main()
