"""Where the Mosaic kernel's time goes (mosaic_direct, MosaicConfig's default): the whole kernel
against copies of it with one part removed. Needs an sm90 GPU.

Usage: python benchmarks/mosaic_direct_ablation.py [--ablations full,no_gather,...]
         [--impl mosaic] [--batches 64,128] [--kv-lens 512,2048] [--timing profiler]

Each ablation swaps one function of the kernel's modules for a stand-in while the kernel is
traced, so it is the same kernel with that part missing; the outputs are garbage and are not
checked (the full kernel's are, by tests/test_mosaic.py). Ablations:
- full: the kernel as it is.
- no_gather: the producer fills nothing (its barriers run as before): the consumers' bound.
- no_softmax: P = S, the running max and sum untouched.
- no_mma: no wgmma at all (QK and PV): the producer's and the softmax's bound.
- gather_only: no wgmma and no softmax.
- no_s_exchange: warpgroup 1 does not read S from shared memory (zeros; the barriers run).
- no_store: the consumers write no results (out, lse): the epilogue's stores.
- empty: no gather, no wgmma, no softmax, no stores: launch, barriers and the loop alone.
Times are us per call of gpu_decode.py's jitted loop (30 calls, changing indices, median of
interleaved rounds), 128 heads, one token per sequence; with --timing profiler, the GPU's busy
time per call (benchmarks/device_time.py), so the loop's gaps drop out.
"""

import argparse
import contextlib
import statistics

import jax

import device_time
import gpu_decode as gd
from jax_mla._src import mosaic_consumer, mosaic_decode, mosaic_gather

ABLATIONS = ("full", "no_gather", "no_softmax", "no_mma", "gather_only", "no_s_exchange",
             "no_store", "empty")


@contextlib.contextmanager
def patched(obj, name, value):
  old = getattr(obj, name)
  setattr(obj, name, value)
  try:
    yield
  finally:
    setattr(obj, name, old)


def _no_softmax(s, base_entry, length, acc, m_i, l_i):
  del base_entry, length
  return s, acc, m_i, l_i


def _no_softmax_scores(s, base_entry, length, m_i, l_i):
  del base_entry, length
  return s, l_i * 0 + 1, m_i, l_i  # alpha = 1 in the row layout (l_i is finite)


def ablation(name):
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  stack = contextlib.ExitStack()
  parts = {"no_gather": ["gather"], "no_softmax": ["softmax"], "no_mma": ["mma"],
           "gather_only": ["mma", "softmax"], "no_s_exchange": ["s_exchange"],
           "no_store": ["store"], "empty": ["gather", "mma", "softmax", "store"]}.get(name, [])
  if "gather" in parts:
    stack.enter_context(patched(mosaic_gather, "gather_dequantize", lambda *a, **k: None))
  if "softmax" in parts:
    stack.enter_context(patched(mosaic_consumer, "softmax_step", _no_softmax))
    stack.enter_context(patched(mosaic_consumer, "softmax_scores", _no_softmax_scores))
  if "store" in parts:
    stack.enter_context(patched(mosaic_consumer, "write_results", lambda *a, **k: None))
  if "mma" in parts:
    stack.enter_context(patched(plgpu, "wgmma", lambda *a, **k: None))
  if "s_exchange" in parts:
    def load_zeros(ref, idx, *, layout, optimized=True):
      del idx, optimized
      return plgpu.layout_cast(jax.numpy.zeros(ref.shape, ref.dtype), layout)
    # Warpgroup 1 reads zeros (so does the sink load of one-split calls); warpgroup 0's
    # store of S stays, without its reader.
    stack.enter_context(patched(plgpu, "load", load_zeros))
  return stack


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--ablations", default=",".join(ABLATIONS))
  ap.add_argument("--batches", default="64,128")
  ap.add_argument("--kv-lens", default="2048")
  ap.add_argument("--timing", choices=["clock", "profiler"], default="clock")
  ap.add_argument("--steps", type=int, default=30)
  ap.add_argument("--rounds", type=int, default=5)
  # The ablations were written for the "s_exchange" consumers (warpgroup 1 reads S).
  ap.add_argument("--impl", default="mosaic_s_exchange",
                  help="a variant of gpu_decode.MOSAIC_IMPLS, e.g. mosaic_qk_ahead")
  a = ap.parse_args()
  cfg = mosaic_decode.MosaicConfig(**gd.MOSAIC_IMPLS[a.impl])
  names = a.ablations.split(",")
  # A paired CTA's K tile is complete when its peer's half arrives (mosaic_pair): without the
  # gather it never does, and the kernel waits forever (it did on the H200, 2026-12-03).
  no_gather = [n for n in names if n in ("no_gather", "empty")]
  if no_gather and cfg.pair_row_blocks is not False:
    raise SystemExit(f"{', '.join(no_gather)}: a kernel with paired CTAs hangs without its "
                     "gather; use an unpaired variant such as mosaic_unpaired")
  print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, {a.impl}")
  print("| B | K | " + " | ".join(names) + " |\n|---|---|" + "---|" * len(names))
  shapes = [(int(b), int(k)) for b in a.batches.split(",") for k in a.kv_lens.split(",")]
  for batch, kv_len in shapes:
    p = gd.make_problem(jax.random.key(0), batch=batch, heads=128, tokens_per_seq=1,
                        kv_len=kv_len)
    runs = {}
    for name in names:
      run = gd.looped(gd.decode_fn(a.impl, tokens_per_seq=1), a.steps)  # a trace of its own
      with ablation(name):
        jax.block_until_ready(run(p))  # traces and compiles under the stand-in
      runs[name] = run
    times = {name: [] for name in names}
    for _ in range(a.rounds):
      for name in names:
        if a.timing == "profiler":
          times[name].append(device_time.device_time_us(
              lambda run=runs[name]: jax.block_until_ready(run(p)), a.steps))
        else:
          times[name].append(gd.time_once(runs[name], p, a.steps))
    print(f"| {batch} | {kv_len} | "
          + " | ".join(f"{statistics.median(times[n]):.1f}" for n in names) + " |", flush=True)


if __name__ == "__main__":
  main()
