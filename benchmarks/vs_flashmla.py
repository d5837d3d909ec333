"""jax_mla against FlashMLA on one GPU, side by side in one run, on the same shapes and data.

Times the public `jax_mla.decode` (default backend "pallas") and, when `flash_mla` is
importable (built by the user from its public source: ../shared/bench/flashmla/README.md of the
project's notes says how; never vendored), FlashMLA's sm90 MODEL1 fp8 sparse decode (bf16 Q,
attention sink, scheduling metadata computed once, as a served model reuses it across layers).
Also the layouts FlashMLA does not serve (16 heads x 4 tokens, 32 heads) against the plain
jitted XLA decode (benchmarks/gpu_decode.py's), at batch >= 32.

Same data: one pool of 65536 rows, packed once by `jax_mla.pack_rows` and given to FlashMLA in
its byte order by `jax_mla.to_flashmla` (a byte shuffle: the same fp8 values and scales); Q from
the same bf16 values (jax_mla takes them packed, FlashMLA as bf16); the same index lists.

Same method for both: 30 calls whose indices change every call ((indices + call * 4099) mod
65536), run under the framework's profiler; the GPU busy time per call is the union of the
GPU events' intervals (benchmarks/timing/device_time.py); median of 3 rounds. jax_mla's calls
run in one jitted loop whose index update (one small fused kernel per call, about 1 us on the
H200) is inside its time and is measured alone and subtracted ("net"); the loop keeps each
call's output as its carry and takes the batch's indptr as an argument (a server builds it
once per step for all its layers), so nothing else of the loop's counts; the results file
lists the kernels each loop ran. FlashMLA's index lists are made before its loop and its
metadata once. FlashMLA runs in a child process (one profiler per process; PyTorch
and JAX each hold their own GPU memory).

Usage (on the GPU machine, from the repository root):
  PYTHONPATH=src FLASHMLA_DIR=.flashmla python benchmarks/vs_flashmla.py
      [--suite all|flash|others|quick | --shape HEADS,TOKENS,BATCH,K ...]
      [--out benchmarks/results/NAME]
`--shape` (repeatable) times the shapes given instead of a suite: those FlashMLA serves (one
token, 64 or 128 heads) beside FlashMLA, the rest beside plain XLA.
Writes NAME.json (every time, TFLOP/s and ratio) and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from timing import call_loop

POOL, BLOCK, STEPS, ROUNDS = 65536, 64, 30, 3
FLASH_HEADS = (128, 64)
HEADS_BATCHES_K = [(h, b, k) for h in FLASH_HEADS for b in (1, 8, 32, 64, 128)
                   for k in (512, 1024, 2048)]
# (heads, tokens_per_seq) FlashMLA does not serve: against plain XLA at batch >= 32.
OTHER_LAYOUTS = [(16, 4), (32, 1)]


def shapes(suite):
  """(heads, tokens_per_seq, batch, K) of the suite."""
  if suite == "quick":
    return ([(128, 1, b, k) for b in (1, 128) for k in (512, 2048)],
            [(h, t, 64, 2048) for h, t in OTHER_LAYOUTS])
  flash = [(h, 1, b, k) for h, b, k in HEADS_BATCHES_K]
  others = [(h, t, b, k) for h, t in OTHER_LAYOUTS for b in (32, 64, 128) for k in (512, 2048)]
  # "flash" and "others": the two halves of "all", for a command time limit that "all" exceeds.
  return {"all": (flash, others), "flash": (flash, []), "others": ([], others)}[suite]


def parse_shape(text):
  """'HEADS,TOKENS,BATCH,K' -> (heads, tokens, batch, k), each a positive integer."""
  try:
    shape = tuple(int(v) for v in text.split(","))
  except ValueError:
    shape = ()
  if len(shape) != 4 or min(shape) < 1:
    raise argparse.ArgumentTypeError(
        f"a shape is HEADS,TOKENS,BATCH,K of positive integers, e.g. 128,1,64,2048; got {text!r}")
  return shape


def given_shapes(shapes_):
  """(flash, others) of the --shape list, in its order: FlashMLA serves one token of 64 or 128
  heads (FLASH_HEADS); the rest are timed beside plain XLA."""
  served = lambda s: s[1] == 1 and s[0] in FLASH_HEADS
  return [s for s in shapes_ if served(s)], [s for s in shapes_ if not served(s)]


def problem(heads, tokens, batch, k):
  """The shape's data as NumPy: bf16-valued Q (as f32), pool values, first index lists."""
  rng = np.random.default_rng(heads * 1000003 + batch * 1009 + k)
  return dict(q=(rng.standard_normal((batch * tokens, heads, 512)) * 0.05).astype(np.float32),
              indices=rng.integers(0, POOL, (batch, k), dtype=np.int32),
              sink=rng.standard_normal(heads).astype(np.float32))


def flops(heads, tokens, batch, k):
  return 2.0 * batch * tokens * heads * k * 1024


# --- jax_mla and plain XLA (this process) -------------------------------------------------------

def packed_pool():
  """The timed runs' pool, packed (jax arrays kv, kv_rope): POOL rows of bf16-valued normals."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import jax_mla  # pylint: disable=import-outside-toplevel
  pool = jax.random.normal(jax.random.PRNGKey(0), (POOL, 512), jnp.float32).astype(jnp.bfloat16)
  return jax_mla.pack_rows(pool)


def make_pool(pool_dir):
  """The packed pool (packed_pool), also saved in FlashMLA's byte order for the child."""
  import jax_mla  # pylint: disable=import-outside-toplevel
  kv, kv_rope = packed_pool()
  np.save(os.path.join(pool_dir, "flashmla_cache.npy"),
          np.asarray(jax_mla.to_flashmla(kv, kv_rope, BLOCK)))
  return kv, kv_rope


def call_args(shape):
  """The timed loops' arguments at `shape`: (packed Q, its RoPE, the first index lists
  [batch, K], the sink, the batch's indptr). The indptr is an argument, as a server passes the
  one it builds per step for all its layers (as FlashMLA's metadata is made once): built from
  the static shapes inside the loop, XLA rebuilt that constant with a kernel every call (0.7 us
  on the H200 in run 5, charged to jax_mla; `xla_kernels.py` shows it)."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import jax_mla  # pylint: disable=import-outside-toplevel
  data = problem(*shape)
  q, q_rope = jax_mla.pack_rows(jnp.asarray(data["q"]))
  batch, k = data["indices"].shape
  return (q, q_rope, jnp.asarray(data["indices"]), jnp.asarray(data["sink"]),
          jnp.arange(batch + 1, dtype=jnp.int32) * k)


def looped(f):
  """STEPS calls of f(q, q_rope, idx, sink, indptr, *more) in one jitted loop (timing.call_loop)
  over call_args (and any more arguments), the indices moved on by call_loop.STRIDE every
  call."""
  return call_loop.looped(
      lambda i, q, q_rope, idx0, *rest: f(q, q_rope, call_loop.moved(idx0, i, POOL), *rest),
      STEPS)


def index_update(q, q_rope, idx, sink, indptr):
  """The loop's own work: looped(index_update) is what every loop's time is net of."""
  del q, q_rope, sink, indptr
  return idx


def decode_call(kv, kv_rope, tokens, backend):
  """f(q, q_rope, idx [batch, K], sink, indptr) -> out: the public decode over the packed
  pool."""
  import jax_mla  # pylint: disable=import-outside-toplevel

  def call(q, q_rope, idx, sink, indptr):
    return jax_mla.decode(q, q_rope, kv, kv_rope, indptr, idx.reshape(-1), sink,
                          tokens_per_seq=tokens, backend=backend)[0]
  return call


def device_rounds(runs, args, rounds):
  """({name: [GPU busy us per call, one per round]}, {name: {kernel: us per call}} of the last
  round): the looped runs interleaved within each round (each already compiled)."""
  import jax  # pylint: disable=import-outside-toplevel
  from timing import device_time  # pylint: disable=import-outside-toplevel
  times = {name: [] for name in runs}
  kernels = {}
  for _ in range(rounds):
    for name, run in runs.items():
      busy, kernels[name] = device_time.device_profile(
          lambda run=run: jax.block_until_ready(run(*args)), STEPS)
      times[name].append(busy)
  return times, kernels


def rounded_kernels(kernels):
  """{kernel: us per call} rounded to ns, the slowest first (the results files' form)."""
  return {name: round(us, 3) for name, us in sorted(kernels.items(), key=lambda kv: -kv[1])}


def time_jax(flash_shapes, other_shapes, backend, kv, kv_rope, progress):
  """jax_mla (and plain XLA for other_shapes) per shape; `progress(rows)` after each."""
  import jax  # pylint: disable=import-outside-toplevel
  from gpu_decode import plain_xla_decode  # pylint: disable=import-outside-toplevel

  def impl(name, tokens):
    if name == "plain":
      return lambda q, q_rope, idx, sink, indptr: plain_xla_decode(
          q, q_rope, kv, kv_rope, idx, sink, tokens_per_seq=tokens)[0]
    return decode_call(kv, kv_rope, tokens, backend)

  rows = []
  update = looped(index_update)  # shape-polymorphic: one function, any shape
  for shape, impls in [(s, ("jax_mla", "index_update")) for s in flash_shapes] + \
                      [(s, ("jax_mla", "plain", "index_update")) for s in other_shapes]:
    heads, tokens, batch, k = shape
    args = call_args(shape)
    runs = {name: update if name == "index_update" else looped(impl(name, tokens))
            for name in impls}
    for run in runs.values():
      jax.block_until_ready(run(*args))
    times, kernels = device_rounds(runs, args, ROUNDS)
    med = {name: statistics.median(t) for name, t in times.items()}
    row = dict(heads=heads, tokens_per_seq=tokens, batch=batch, k=k,
               index_update_us=med["index_update"],
               jax_mla_us=med["jax_mla"] - med["index_update"], jax_mla_rounds=times["jax_mla"],
               # What each loop ran, per call (last round): the net time is the first less
               # the second.
               jax_mla_kernels=rounded_kernels(kernels["jax_mla"]),
               index_update_kernels=rounded_kernels(kernels["index_update"]))
    if "plain" in med:
      row["plain_us"] = med["plain"] - med["index_update"]
      row["jax_mla_over_plain"] = row["plain_us"] / row["jax_mla_us"]
    row["jax_mla_tflops"] = flops(*shape) / row["jax_mla_us"] / 1e6
    rows.append(row)
    print(f"jax_mla H{heads}x{tokens} B{batch} K{k}: {row['jax_mla_us']:.1f} us net "
          f"({row['jax_mla_tflops']:.0f} TFLOP/s)"
          + (f", plain XLA {row['plain_us']:.1f} us" if "plain_us" in row else ""), flush=True)
    progress(rows)
  return rows


# --- FlashMLA (a child process) -----------------------------------------------------------------

def time_flashmla(flash_shapes, pool_dir):
  """Runs in the child: FlashMLA's busy time per call for each shape."""
  import torch  # pylint: disable=import-outside-toplevel
  import flash_mla  # pylint: disable=import-outside-toplevel
  from timing import device_time  # pylint: disable=import-outside-toplevel

  cache = torch.from_numpy(np.load(os.path.join(pool_dir, "flashmla_cache.npy"))).cuda()
  rows = []
  for heads, tokens, batch, k in flash_shapes:
    data = problem(heads, tokens, batch, k)
    q = torch.from_numpy(data["q"]).to(torch.bfloat16).cuda().reshape(batch, 1, heads, 512)
    sink = torch.from_numpy(data["sink"]).cuda()
    first = torch.from_numpy(data["indices"]).cuda()
    idx = [call_loop.moved(first, i, POOL).reshape(batch, 1, k).contiguous()
           for i in range(STEPS)]
    meta, _ = flash_mla.get_mla_metadata()
    call = lambda i: flash_mla.flash_mla_with_kvcache(  # pylint: disable=cell-var-from-loop
        q, cache, None, None, 512, meta, None, 512 ** -0.5, False, True, idx[i], sink)
    call(0)
    torch.cuda.synchronize()
    times = []
    for _ in range(ROUNDS):
      with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(STEPS):
          call(i)
        torch.cuda.synchronize()
      with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace:
          events = json.load(trace)["traceEvents"]
      times.append(device_time.torch_busy_us(events) / STEPS)
    rows.append(dict(heads=heads, tokens_per_seq=tokens, batch=batch, k=k,
                     flashmla_us=statistics.median(times), flashmla_rounds=times))
    print(f"flashmla H{heads} B{batch} K{k}: {rows[-1]['flashmla_us']:.1f} us", flush=True)
  return rows


def flashmla_importable() -> tuple[bool, str]:
  flash_dir = os.environ.get("FLASHMLA_DIR")
  env = dict(os.environ)
  if flash_dir:
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.abspath(flash_dir),
                                                      env.get("PYTHONPATH", "")]))
  probe = subprocess.run([sys.executable, "-c", "import flash_mla"], env=env,
                         capture_output=True, text=True)
  return probe.returncode == 0, (probe.stderr.strip().splitlines() or [""])[-1]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  chosen = parser.add_mutually_exclusive_group()
  chosen.add_argument("--suite", default="all", choices=["all", "flash", "others", "quick"])
  chosen.add_argument("--shape", action="append", type=parse_shape, default=None,
                      metavar="HEADS,TOKENS,BATCH,K",
                      help="time these shapes instead of the suite's (repeatable)")
  parser.add_argument("--backend", default="pallas")
  parser.add_argument("--out", default=None)
  parser.add_argument("--flashmla-child", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  flash_shapes, other_shapes = given_shapes(args.shape) if args.shape else shapes(args.suite)

  if args.flashmla_child:  # the child: FlashMLA only, results as JSON on the last line
    rows = time_flashmla(flash_shapes, args.flashmla_child)
    print(json.dumps(rows))
    return

  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # FlashMLA's torch needs room
  import jax  # pylint: disable=import-outside-toplevel
  meta = dict(device=jax.devices()[0].device_kind, jax=jax.__version__, backend=args.backend,
              suite="given shapes" if args.shape else args.suite,
              date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              steps=STEPS, rounds=ROUNDS, pool=POOL,
              method="GPU busy time per call (profiler trace: union of GPU event intervals), "
                     "30 calls with indices changing every call, median of 3 rounds; jax_mla "
                     "net of its loop's index update (the loop carries each output; indptr made "
                     "once); FlashMLA metadata computed once")
  with tempfile.TemporaryDirectory() as pool_dir:
    kv, kv_rope = make_pool(pool_dir)
    ok, why = flashmla_importable() if flash_shapes else (False, "no FlashMLA shapes in the suite")
    flash = {}
    if ok:  # first: its child is short, and its numbers survive a later time limit
      env = dict(os.environ)
      flash_dir = os.environ.get("FLASHMLA_DIR")
      paths = [os.path.abspath(flash_dir)] if flash_dir else []
      env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
      shape_args = [a for s in flash_shapes for a in ("--shape", ",".join(map(str, s)))]
      child = subprocess.run([sys.executable, __file__, *shape_args, "--flashmla-child",
                              pool_dir], env=env, capture_output=True, text=True, check=False)
      sys.stdout.write("\n".join(child.stdout.splitlines()[:-1]) + "\n")
      if child.returncode == 0:
        flash = {(r["heads"], r["batch"], r["k"]): r for r in json.loads(
            child.stdout.splitlines()[-1])}
      else:
        why = f"its run failed: {child.stderr.strip()[-2000:]}"
        print(f"FlashMLA {why}")
    else:
      print(f"FlashMLA not importable ({why}): jax_mla only")
    meta["flashmla"] = "measured" if flash else f"not importable: {why}"

    def progress(rows):
      joined = [join(row, flash) for row in rows]
      if args.out:
        with open(args.out + ".json", "w") as out:
          json.dump(dict(meta=meta, rows=joined), out, indent=1)

    rows = [join(row, flash) for row in time_jax(flash_shapes, other_shapes, args.backend, kv,
                                                  kv_rope, progress)]
  print_table(rows)


def join(row, flash):
  """row with FlashMLA's time for its shape (when measured) and the ratio."""
  f = flash.get((row["heads"], row["batch"], row["k"])) if row["tokens_per_seq"] == 1 else None
  if not f:
    return row
  return dict(row, flashmla_us=f["flashmla_us"], flashmla_rounds=f["flashmla_rounds"],
              flashmla_tflops=flops(row["heads"], 1, row["batch"], row["k"]) /
              f["flashmla_us"] / 1e6,
              flashmla_over_jax_mla=f["flashmla_us"] / row["jax_mla_us"])


def print_table(rows):
  print(f"{'heads':>5} {'tok':>3} {'batch':>5} {'K':>5} {'jax_mla us':>10} {'TFLOP/s':>7} "
        f"{'FlashMLA us':>11} {'TFLOP/s':>7} {'FlashMLA/jax_mla':>16} {'plain/jax_mla':>13}")
  ratios = []
  for r in rows:
    ratio = r.get("flashmla_over_jax_mla")
    if ratio:
      ratios.append(ratio)
    print(f"{r['heads']:>5} {r['tokens_per_seq']:>3} {r['batch']:>5} {r['k']:>5} "
          f"{r['jax_mla_us']:>10.1f} {r['jax_mla_tflops']:>7.0f} "
          f"{r.get('flashmla_us', float('nan')):>11.1f} "
          f"{r.get('flashmla_tflops', float('nan')):>7.0f} {ratio or float('nan'):>16.3f} "
          f"{r.get('jax_mla_over_plain', float('nan')):>13.2f}")
  if ratios:
    above, geomean = summary(ratios)
    print(f"FlashMLA/jax_mla: {above} of {len(ratios)} shapes >= 1.0, geometric mean "
          f"{geomean:.3f}")


def summary(ratios):
  """(how many of the FlashMLA / jax_mla ratios are at or above 1.0, their geometric mean)."""
  return sum(x >= 1 for x in ratios), float(np.exp(np.mean(np.log(ratios))))


if __name__ == "__main__":
  main()
