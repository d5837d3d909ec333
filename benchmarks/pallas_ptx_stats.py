"""Registers, spills and shared memory of the compiled Pallas kernel (ptxas -v on XLA's PTX dump).

Usage (on the GPU machine): python benchmarks/pallas_ptx_stats.py 64x64w8s2 64x64w8s2-pf ...
Unverified: its one run on the H200 (2026-12-02) printed nothing within a 100 s limit; whether
XLA's dump holds the Triton kernel's PTX under this jax is not established.
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile

DUMP = tempfile.mkdtemp(prefix="xla_dump_")
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={DUMP}"

import jax  # noqa: E402  pylint: disable=wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_decode  # noqa: E402  pylint: disable=wrong-import-position


def ptxas():
  for path in (shutil.which("ptxas"), "/usr/local/cuda/bin/ptxas"):
    if path and os.path.exists(path):
      return path
  import triton  # pylint: disable=import-outside-toplevel
  return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def main():
  p = gpu_decode.make_problem(jax.random.PRNGKey(0), batch=128, heads=128, tokens_per_seq=1,
                              kv_len=2048)
  for text in sys.argv[1:]:
    before = set(glob.glob(f"{DUMP}/*.ptx"))
    f = jax.jit(gpu_decode.decode_fn("pallas", tokens_per_seq=1,
                                     config=gpu_decode.parse_config(text)))
    jax.block_until_ready(f(p, p["indices"]))
    for ptx in sorted(set(glob.glob(f"{DUMP}/*.ptx")) - before):
      out = subprocess.run([ptxas(), "-arch=sm_90a", "-v", ptx, "-o", "/dev/null"],
                           capture_output=True, text=True)
      lines = (out.stderr + out.stdout).splitlines()
      keep = [l for i, l in enumerate(lines) if "pallas" in l or (
          i > 0 and "pallas" in lines[i - 1]) or (i > 1 and "pallas" in lines[i - 2])]
      print(f"== {text}: {os.path.basename(ptx)}\n" + "\n".join(keep or lines[-6:]), flush=True)


if __name__ == "__main__":
  main()
