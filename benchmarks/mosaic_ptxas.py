"""What ptxas says about the Mosaic decode kernel: registers, spills, and whether it serialized
the wgmmas (C7512), per MosaicConfig variant.

Usage (on the GPU machine): python benchmarks/mosaic_ptxas.py default unpaired 216_160_128 ...
A variant is a name below, warpgroup registers as R0_R1_R2 (MosaicConfig.direct_registers),
or both as NAME_R0_R1_R2 (unpaired_208_176_120).
Each compiles and runs one 128-head decode in a subprocess with MOSAIC_GPU_DUMP_PTXAS=1 and
prints ptxas's lines about registers, spills, stack and performance loss.

On the H200 (2026-12-03) this found the direct design's first register split (192 / 160 /
152) spilling 276 bytes with every wgmma serialized (benchmarks/NOTES-pallas.md).
"""

import functools
import os
import re
import subprocess
import sys

NAMED = {"default": {}, "unpaired": {"pair_row_blocks": False}}
INTERESTING = re.compile(r"spill|serializ|Used \d+ registers|C75\d\d|stack frame", re.I)


def config_fields(name):
  if name in NAMED:
    return NAMED[name]
  match = re.fullmatch(r"(?:([a-z_]+)_)?(\d+)_(\d+)_(\d+)", name)
  if match and (match[1] is None or match[1] in NAMED):
    return {**NAMED.get(match[1], {}),
            "direct_registers": tuple(int(r) for r in match.groups()[1:])}
  raise SystemExit(f"unknown variant {name!r}: one of {sorted(NAMED)}, R0_R1_R2 or "
                   "NAME_R0_R1_R2")


def compile_one(name):
  """In the subprocess: one decode with the variant, which makes Mosaic run ptxas."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  sys.path[:0] = [os.path.join(root, "src"), os.path.join(root, "tests")]
  from support.rows import make_batch  # pylint: disable=import-outside-toplevel
  from jax_mla._src.pallas.mosaic import decode as md  # pylint: disable=import-outside-toplevel
  batch = make_batch(np.random.default_rng(1), num_heads=128, lengths=[300, 2], sink=0.3)
  fn = jax.jit(functools.partial(md.mosaic_decode, tokens_per_seq=1, num_kv_splits_=1,
                                 config=md.MosaicConfig(**config_fields(name))))
  jax.block_until_ready(fn(*batch.args()[:-1], batch.sink_array()))


def main():
  if len(sys.argv) == 3 and sys.argv[1] == "--one":
    compile_one(sys.argv[2])
    return
  for name in sys.argv[1:] or ["default"]:
    config_fields(name)  # an unknown name fails before any compilation
    env = dict(os.environ, MOSAIC_GPU_DUMP_PTXAS="1")
    run = subprocess.run([sys.executable, __file__, "--one", name], env=env,
                         capture_output=True, text=True, check=False)
    lines = (run.stdout + run.stderr).splitlines()
    print(f"== {name} (exit {run.returncode})")
    for line in dict.fromkeys(l.strip() for l in lines if INTERESTING.search(l)):
      print("  " + line)
    if run.returncode:
      print("  " + "\n  ".join(lines[-5:]))


if __name__ == "__main__":
  main()
