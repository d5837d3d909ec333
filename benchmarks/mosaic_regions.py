"""Where the Mosaic kernel's warpgroups spend their cycles, by named region, from the Mosaic GPU
profiler: a CTA's time before its first block, per block and after its last, for each role.

The kernel marks its regions (`mosaic.kernel.region`: the producer's "first_loads",
"free_wait" and "gather"; warpgroup 0's "q_load", then per block "tile_wait", "qk", "softmax",
"p_free_wait", "p_publish" and "pv", then "epilogue"; warpgroup 1's per block "p_wait" and
"pv", then "ml_wait" and "epilogue"). This script builds the public decode with a profile space
(`profiled_build`: the kernel's CompilerParams given the profiler's settings), runs one call per
shape, and summarizes the trace the profiler writes (`timing/kernel_trace.py`).

Units: the profiler stamps each region's ends with the SM's cycle counter (%clock), so the
durations here are SM cycles (about 1.7-1.98 per ns on the H200, by its clock). Each stamp is a
shared-memory store of one thread per warpgroup, a few tens of cycles: regions that short are
mostly the profiler's own cost, and the profiled kernel runs a little slower than the timed one.

Usage (on the GPU machine, from the repository root):
  PYTHONPATH=src:benchmarks python benchmarks/mosaic_regions.py
      [--shapes "[[128, 1, 128, 2048], [128, 1, 1, 512]]"] [--out FILE.json]
Shapes are [heads, tokens_per_seq, batch, K], as in vs_flashmla.py.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import os
import tempfile

DEFAULT_SHAPES = [[128, 1, 128, 2048], [128, 1, 64, 512], [64, 1, 128, 2048], [128, 1, 1, 512]]
ROLES = {0: "qk_softmax", 1: "pv", 2: "producer"}
WARPGROUPS = len(ROLES)
# Regions warpgroup 0 enters per block (the most of any role), and those outside the blocks.
REGIONS_PER_BLOCK = 6
REGIONS_OUTSIDE_BLOCKS = 4
BLOCK_KV = 64


def profile_space(k: int) -> int:
  """Regions per warpgroup to make room for: a CTA walks at most ceil(K / 64) blocks (one
  split); more splits walk fewer."""
  return REGIONS_PER_BLOCK * math.ceil(k / BLOCK_KV) + REGIONS_OUTSIDE_BLOCKS


def summarize_cycles(trace: dict) -> dict:
  """{"regions": {role: {region: {entries, median_cycles, total_kcycles, share}}},
  "span_kcycles": {role: median span of one warpgroup}} of one profiler trace, whose "ts" are
  thousands of cycles (module docstring)."""
  from timing import kernel_trace  # pylint: disable=import-outside-toplevel
  stats, spans = kernel_trace.summarize(trace, WARPGROUPS, ROLES)
  return dict(
      regions={role: {name: dict(entries=s.count, median_cycles=round(s.median * 1e3),
                                 total_kcycles=round(s.total, 1), share=round(s.share, 3))
                      for name, s in regions.items()}
               for role, regions in stats.items()},
      span_kcycles={role: round(span, 1) for role, span in spans.items()})


def format_cycles(summary: dict) -> str:
  lines = ["| role | region | entries | median cycles | share of span |", "|---|---|---|---|---|"]
  for role, regions in summary["regions"].items():
    for name, s in sorted(regions.items(), key=lambda kv: -kv[1]["share"]):
      lines.append(f"| {role} | {name} | {s['entries']} | {s['median_cycles']} | "
                   f"{s['share']:.2f} |")
  lines += [f"median span of one {role} warpgroup: {k:.1f} kcycles"
            for role, k in summary["span_kcycles"].items()]
  return "\n".join(lines)


class _ProfiledPlgpu:
  """Pallas's mosaic_gpu module, except that its CompilerParams also carry `settings`."""

  def __init__(self, plgpu, settings):
    self._plgpu, self._settings = plgpu, settings

  def __getattr__(self, name):
    return getattr(self._plgpu, name)

  def CompilerParams(self, **params):  # pylint: disable=invalid-name
    return self._plgpu.CompilerParams(**params, **self._settings)


@contextlib.contextmanager
def profiled_build(settings):
  """Within the block, the Mosaic decode (mosaic.decode, which takes Pallas's module from its
  _plgpu) builds its kernel with the profiler's `settings` (profile_space, profile_dir)."""
  import mosaic_ab  # pylint: disable=import-outside-toplevel
  from jax_mla._src.pallas.mosaic import decode as mosaic_decode  # pylint: disable=import-outside-toplevel
  profiled = _ProfiledPlgpu(mosaic_decode._plgpu(), settings)  # pylint: disable=protected-access
  with mosaic_ab.overridden([(mosaic_decode, "_plgpu", lambda: profiled)]):
    yield


def profiled_trace(shape, kv, kv_rope) -> dict:
  """The profiler's trace of one decode call at `shape`, built with a profile space."""
  import jax  # pylint: disable=import-outside-toplevel
  import vs_flashmla as vf  # pylint: disable=import-outside-toplevel

  heads, tokens, _, k = shape
  args = vf.call_args(shape)
  with tempfile.TemporaryDirectory() as directory:
    # Bounds-checked: a region count off by a few truncates the trace instead of overwriting
    # the kernel's shared memory.
    settings = dict(profile_space=profile_space(k), profile_dir=directory,
                    profile_bounds_check=True)
    with profiled_build(settings):
      call = jax.jit(vf.decode_call(kv, kv_rope, tokens, "pallas"))
      for _ in range(2):  # the first run compiles; each run writes a trace
        jax.block_until_ready(call(*args))
    paths = sorted(glob.glob(os.path.join(directory, "*.json")))
    if not paths:
      raise RuntimeError(f"the profiler wrote no trace for H{heads} K{k} under {directory}")
    with open(paths[-1]) as f:
      return json.load(f)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--shapes", type=json.loads, default=DEFAULT_SHAPES)
  parser.add_argument("--out", default=None)
  args = parser.parse_args(argv)

  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import jax_mla  # pylint: disable=import-outside-toplevel
  import vs_flashmla as vf  # pylint: disable=import-outside-toplevel

  pool = jax.random.normal(jax.random.PRNGKey(0), (vf.POOL, 512), jnp.float32).astype(jnp.bfloat16)
  kv, kv_rope = jax_mla.pack_rows(pool)
  rows = []
  for shape in args.shapes:
    summary = summarize_cycles(profiled_trace(shape, kv, kv_rope))
    rows.append(dict(heads=shape[0], tokens_per_seq=shape[1], batch=shape[2], k=shape[3],
                     **summary))
    print(f"H{shape[0]}x{shape[1]} B{shape[2]} K{shape[3]}:\n{format_cycles(summary)}\n",
          flush=True)
  if args.out:
    meta = dict(device=jax.devices()[0].device_kind, jax=jax.__version__,
                units="SM cycles (the profiler's %clock stamps)")
    with open(args.out, "w") as out:
      json.dump(dict(meta=meta, rows=rows), out, indent=1)
  return rows


if __name__ == "__main__":
  main()
