"""Where the Mosaic GPU decode kernel's staged design spends its time: one profiled call,
summarized per warpgroup role and named region (waits, dequantize, qk, softmax, pv, issue).
Needs an sm90 GPU. (The direct design has no profiled regions: benchmarks/
mosaic_direct_ablation.py times it with parts removed instead.)

Usage: python benchmarks/mosaic_profile.py [--batch 64] [--heads 128] [--kv-len 2048]
                                           [--impl mosaic_staged] [--out results/NAME]

--impl names a staged variant of gpu_decode.MOSAIC_IMPLS. Keep --out files under
benchmarks/results/profiles/ (benchmarks/results/*.json are timing tables, one schema). The
profiler's records take shared memory (16 bytes per region, step and warpgroup): with split_qk
(the default) use --kv-len 512 or less.

The profiler's own cost (a clock read and a shared-memory store per region boundary) is
included; compare regions with each other, not with the unprofiled times of gpu_decode.py.
"""

import argparse
import glob
import json
import os
import sys
import tempfile

import jax

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gpu_decode import MOSAIC_IMPLS, make_problem  # noqa: E402  pylint: disable=wrong-import-position
from jax_mla._src import kernel_trace  # noqa: E402  pylint: disable=wrong-import-position
from jax_mla._src import mosaic_decode as md  # noqa: E402  pylint: disable=wrong-import-position

ROLES = {0: "consumer", 1: "consumer", 2: "producer"}


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--heads", type=int, default=128)
  ap.add_argument("--tokens-per-seq", type=int, default=1)
  ap.add_argument("--kv-len", type=int, default=2048)
  ap.add_argument("--impl", default="mosaic_staged",
                  choices=sorted(n for n, c in MOSAIC_IMPLS.items() if c.get("design") == "staged"))
  ap.add_argument("--out", default="", help="also write the summary as OUT.json and the trace")
  a = ap.parse_args()
  p = make_problem(jax.random.PRNGKey(0), batch=a.batch, heads=a.heads,
                   tokens_per_seq=a.tokens_per_seq, kv_len=a.kv_len)
  trace_dir = tempfile.mkdtemp(prefix="mosaic_trace_")
  # Every step of the longest sequence (one split: the planner may split less at this size).
  steps = -(-a.kv_len // md.BLOCK_KV)
  config = md.MosaicConfig(profile_dir=trace_dir, profile_steps=steps, **MOSAIC_IMPLS[a.impl])
  decode = jax.jit(lambda p: md.mosaic_decode(
      p["q"], p["q_rope"], p["kv"], p["kv_rope"], p["indptr"], p["indices"].reshape(-1),
      p["sink"], tokens_per_seq=a.tokens_per_seq, num_kv_splits_=1, config=config)[0])
  for _ in range(2):  # the second call's trace is the one read (no compilation in it)
    jax.block_until_ready(decode(p))
  jax.effects_barrier()  # the trace is written by a host callback
  newest = max(glob.glob(os.path.join(trace_dir, "*-trace.json")), key=os.path.getmtime)
  with open(newest) as f:
    trace = json.load(f)
  stats, spans = kernel_trace.summarize(trace, len(ROLES), ROLES)
  print(f"{a.impl}: B={a.batch} H={a.heads} tokens/seq={a.tokens_per_seq} K={a.kv_len}, "
        f"{jax.devices()[0].device_kind}, jax {jax.__version__}")
  print(kernel_trace.format_summary(stats, spans))
  if a.out:
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".json", "w") as f:
      json.dump({"shape": vars(a), "spans_us": spans,
                 "regions": {role: {name: vars(s) for name, s in regions.items()}
                             for role, regions in stats.items()}}, f, indent=1)
    print(f"wrote {a.out}.json")


if __name__ == "__main__":
  main()
