"""Rows across devices (`jax_mla.sharding.decode_rows_sharded`) against one device, in one run
(issue 9).

Usage: python benchmarks/sharded_decode.py [--backends reference,pallas] [--devices N]
         [--batch-per-device 64] [--heads 128] [--kv-len 1024] [--pool 65536]
         [--steps 20] [--rounds 5] [--out PREFIX]
A CPU smoke run: XLA_FLAGS=--xla_force_host_platform_device_count=2 python
  benchmarks/sharded_decode.py --backends reference,host --batch-per-device 2 --kv-len 64
  --pool 256 --steps 2 --rounds 1

For each backend, three measurements, interleaved within each round:
  one_device_share  one device decodes one device's share (B sequences);
  one_device_all    one device decodes the whole batch (N * B sequences);
  sharded           N devices decode the whole batch, B sequences each, each with its own pool
                    (the data-parallel row layout of docs/sharding.md).
Each is one jitted loop of --steps calls whose KV indices change every step, timed with a host
clock around it, divided by the steps (the loop's gaps between calls are included alike); the
median over rounds. Scaling = one_device_all / sharded (ideal N); per-device efficiency =
one_device_share / sharded (ideal 1: a device with its share alone is as fast as it is in the
sharded run).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_mla
from jax_mla import sharding as jms
from timing import call_loop


def make_device_problem(key, *, batch, heads, kv_len, pool):
  """One device's share: its queries, its own pool, indices local to it."""
  k1, k2, k3 = jax.random.split(key, 3)
  q, q_rope = jax_mla.pack_rows(jax.random.normal(k1, (batch, heads, 512)) * 0.05)
  kv, kv_rope = jax_mla.pack_rows(jax.random.normal(k2, (pool, 512)))
  indices = jax.random.randint(k3, (batch * kv_len,), 0, pool, jnp.int32)
  indptr = jnp.arange(batch + 1, dtype=jnp.int32) * kv_len
  return [np.asarray(x) for x in (q, q_rope, kv, kv_rope, indptr, indices)]


def concatenated(shares):
  """The row layout: the per-device blocks concatenated on the leading axis."""
  return [np.concatenate(xs) for xs in zip(*shares)]


def merged(shares, pool):
  """The same sequences as one device's problem: one pool, global indices and offsets."""
  q, q_rope, kv, kv_rope, _, _ = concatenated(shares)
  indices = np.concatenate([s[5] + d * pool for d, s in enumerate(shares)])
  lengths = np.concatenate([np.diff(s[4]) for s in shares])
  indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
  return [q, q_rope, kv, kv_rope, indptr, indices]


def looped(decode, steps, pool):
  """steps calls of decode in one jitted loop (timing.call_loop); the indices move within each
  pool every step: a multiple of the pool's size stays added, so no index crosses a pool
  boundary (the same pools' rows, as in the sharded layout)."""
  def call(i, args, sink):
    q, q_rope, kv, kv_rope, indptr, indices = args
    moved = call_loop.moved(indices % pool, i, pool) + (indices // pool) * pool
    return decode(q, q_rope, kv, kv_rope, indptr, moved, sink)[0]
  return call_loop.looped(call, steps)


def time_per_call(run, args, sink, steps):
  t0 = time.perf_counter()
  jax.block_until_ready(run(args, sink))
  return (time.perf_counter() - t0) / steps * 1e6


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--backends", default="reference,pallas")
  ap.add_argument("--devices", type=int, default=0, help="0: every device")
  ap.add_argument("--batch-per-device", type=int, default=64)
  ap.add_argument("--heads", type=int, default=128)
  ap.add_argument("--kv-len", type=int, default=1024)
  ap.add_argument("--pool", type=int, default=65536)
  ap.add_argument("--steps", type=int, default=20)
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--out", default="")
  a = ap.parse_args()
  devices = jax.devices()[:a.devices or None]
  count = len(devices)
  if count < 2:
    raise SystemExit(f"needs 2 or more devices; found {count} ({jax.devices()})")
  mesh = jax.make_mesh((count,), ("x",), axis_types=(AxisType.Explicit,), devices=devices)
  keys = jax.random.split(jax.random.PRNGKey(0), count)
  shares = [make_device_problem(k, batch=a.batch_per_device, heads=a.heads, kv_len=a.kv_len,
                                pool=a.pool) for k in keys]
  sink = jnp.asarray(np.random.default_rng(1).standard_normal(a.heads), jnp.float32)
  one = devices[0]
  problems = {
      "one_device_share": jax.device_put(shares[0], one),
      "one_device_all": jax.device_put(merged(shares, a.pool), one),
      "sharded": [jax.device_put(x, NamedSharding(mesh, P("x"))) for x in concatenated(shares)],
  }
  rows = []
  for backend in a.backends.split(","):
    runs = {
        "one_device_share": looped(lambda *x: jax_mla.decode(*x, backend=backend), a.steps,
                                   a.pool),
        "one_device_all": looped(lambda *x: jax_mla.decode(*x, backend=backend), a.steps,
                                 a.pool),
        "sharded": looped(jms.decode_rows_sharded(mesh, "x", backend=backend), a.steps,
                          a.pool),
    }
    for name, run in runs.items():  # compile and warm up
      jax.block_until_ready(run(problems[name], sink))
    times = {name: [] for name in runs}
    for _ in range(a.rounds):
      for name, run in runs.items():
        times[name].append(time_per_call(run, problems[name], sink, a.steps))
    us = {name: statistics.median(t) for name, t in times.items()}
    row = dict(backend=backend, devices=count, batch_per_device=a.batch_per_device,
               heads=a.heads, kv_len=a.kv_len, **{f"{n}_us": v for n, v in us.items()},
               scaling=us["one_device_all"] / us["sharded"],
               per_device_efficiency=us["one_device_share"] / us["sharded"])
    rows.append(row)
    print(f"{backend}: {count} devices x {a.batch_per_device} sequences, {a.heads} heads, K "
          f"{a.kv_len}: sharded {us['sharded']:.1f} us per call; one device, the whole batch "
          f"{us['one_device_all']:.1f}, one device's share {us['one_device_share']:.1f}; "
          f"scaling {row['scaling']:.2f}x (ideal {count}), per-device efficiency "
          f"{row['per_device_efficiency']:.2f}", flush=True)
  if a.out:
    with open(a.out + ".csv", "w", newline="") as f:
      f.write(f"# {devices[0].device_kind} x {count}, jax {jax.__version__}, "
              "benchmarks/sharded_decode.py: host-clock us per call, median of rounds\n")
      writer = csv.DictWriter(f, fieldnames=list(rows[0]))
      writer.writeheader()
      writer.writerows(rows)


if __name__ == "__main__":
  main()
