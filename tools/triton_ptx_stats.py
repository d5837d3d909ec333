"""Registers, spills, shared memory and MMA shapes of the Pallas (Triton) kernel for sm90,
without a GPU: a developer tool for tuning src/jax_mla/_src/pallas/triton.py on a CPU machine.

It lowers the kernel for CUDA on the CPU with `debug=True` (Pallas prints the Triton IR),
compiles that IR with the `triton` package from PyPI for sm_90a, and runs `ptxas -v` on the PTX.
PyPI's Triton is not the Triton inside XLA, so the numbers are an estimate of what the GPU runs,
good for comparing variants (on 2026-12-02 they ranked the variants as the H200 did).

Needs: pip install triton; ptxas on PATH (CUDA toolkit) or Triton's bundled one.
Usage: python tools/triton_ptx_stats.py [--batch 128] [--kv-len 2048] [--heads 128]
         [--config 'block_kv=32, num_stages=1']
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import jax  # noqa: E402  pylint: disable=wrong-import-position
import jax.numpy as jnp  # noqa: E402  pylint: disable=wrong-import-position
from jax.experimental import pallas as pl  # noqa: E402  pylint: disable=wrong-import-position

from jax_mla._src.pallas import triton as pd  # noqa: E402  pylint: disable=wrong-import-position


def triton_ir(batch, kv_len, heads, config):
  """The Triton IR that Pallas builds for one decode shape, as MLIR text without locations."""
  original = pl.pallas_call

  def with_debug(*args, **kwargs):
    kwargs["debug"] = True  # Pallas prints the Triton module it lowers to
    return original(*args, **kwargs)

  def decode(*args):
    return pd.pallas_decode(*args, tokens_per_seq=1, config=config)

  args = (jax.ShapeDtypeStruct((batch, heads, 512), jnp.uint8),
          jax.ShapeDtypeStruct((batch, heads, 64), jnp.bfloat16),
          jax.ShapeDtypeStruct((65536, 512), jnp.uint8),
          jax.ShapeDtypeStruct((65536, 64), jnp.bfloat16),
          jax.ShapeDtypeStruct((batch + 1,), jnp.int32),
          jax.ShapeDtypeStruct((batch * kv_len,), jnp.int32),
          jax.ShapeDtypeStruct((heads,), jnp.float32))
  printed = io.StringIO()
  pl.pallas_call = with_debug
  try:
    with contextlib.redirect_stdout(printed):
      jax.export.export(jax.jit(decode), platforms=["cuda"], disabled_checks=[
          jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(*args)
  finally:
    pl.pallas_call = original
  text = printed.getvalue()
  text = text[text.index("module @"):]
  text = re.sub(r' "[^"\n]*"\(#loc\d+\)', "", text)  # named locations
  text = re.sub(r" \[[^\]\n]*\]", "", text)  # pretty-printed locations
  text = re.sub(r" #loc\d*", "", text)
  return text[:text.index("\n}\n") + 3]


def ptxas_binary():
  found = shutil.which("ptxas")
  if found:
    return found
  import triton  # pylint: disable=import-outside-toplevel
  return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=128)
  ap.add_argument("--kv-len", type=int, default=2048)
  ap.add_argument("--heads", type=int, default=128)
  ap.add_argument("--config", default="", help="KernelConfig fields, e.g. 'block_kv=32'")
  a = ap.parse_args()
  import triton  # pylint: disable=import-outside-toplevel
  from triton.backends.compiler import GPUTarget  # pylint: disable=import-outside-toplevel

  config = pd.KernelConfig(**eval(f"dict({a.config})"))  # pylint: disable=eval-used
  with tempfile.TemporaryDirectory() as tmp:
    ttir = os.path.join(tmp, "kernel.ttir")
    with open(ttir, "w") as f:
      f.write(triton_ir(a.batch, a.kv_len, a.heads, config))
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    kernel = triton.compile(ttir, target=GPUTarget("cuda", 90, 32), options=dict(
        num_warps=config.num_warps, num_stages=config.num_stages))
    ptx = kernel.asm["ptx"]
    ptx_path = os.path.join(tmp, "kernel.ptx")
    with open(ptx_path, "w") as f:
      # An older ptxas reads the PTX of a newer Triton once the version line is lowered.
      f.write(re.sub(r"^\.version \d+\.\d+", ".version 8.8", ptx, flags=re.M))
    info = subprocess.run([ptxas_binary(), "-arch=sm_90a", "-v", ptx_path, "-o",
                           os.path.join(tmp, "kernel.cubin")], capture_output=True, text=True)
  print(f"config: {config}")
  print(f"shared memory: {kernel.metadata.shared} bytes")
  shapes = collections.Counter(re.findall(r"wgmma\.mma_async\S*", ptx))
  for shape, count in sorted(shapes.items()):
    print(f"{count:4d} x {shape}")
  print(f"{ptx.count('mma.sync'):4d} x mma.sync, {ptx.count('cp.async.'):4d} x cp.async, "
        f"{ptx.count('wgmma.wait_group'):4d} x wgmma.wait_group")
  for line in (info.stdout + info.stderr).splitlines():
    if "spill" in line or "Used" in line or "error" in line:
      print(line.strip())


if __name__ == "__main__":
  main()
