"""Variants of the Mosaic GPU kernel's settings, timed side by side in one run on one GPU.

A variant is a name and overrides of the kernel modules' constants
(`jax_mla._src.pallas.mosaic.{kernel,gather,consumer,decode,pair}`, and
`jax_mla._src.pallas.merge` and `.plan`, the split merge and the split planner), given as
Python literals:

  --variant "regs:kernel.REGISTERS={True: {0: 192, 1: 160, 2: 152}, False: {0: 192, 1: 160, 2: 152}}"
  --variant "carry3:gather.CARRIED_GROUPS={True: 2, False: 3}"
  --variant "merge_kernel:merge.KERNEL_MERGE_MIN_SPLITS=2"

Each variant's decode is traced with its overrides set (they are read while the kernel is
built) and restored after; "default" (the settings as committed) always runs. The timing is
vs_flashmla.py's: the public `jax_mla.decode(backend="pallas")` in a jitted loop of 30 calls
whose indices change every call, GPU busy time per call from a profiler trace, net of the loop's
index update, the variants interleaved within each of --rounds rounds, the median; the results
file also lists the kernels each variant's loop ran (GPU us per call, last round), so a variant
that moves time between the decode kernel and the merge shows where, and each variant's output
against the default's (finite, max |difference|). This is how
the register splits and carried row groups in benchmarks/README.md were chosen (2026-12-04).

Usage (on the GPU machine, from the repository root):
  PYTHONPATH=src python benchmarks/mosaic_ab.py --variant NAME:MODULE.ATTR=VALUE ...
      [--shapes "[[128, 1, 128, 2048], [64, 1, 64, 512]]"] [--out FILE.json]
Shapes are [heads, tokens_per_seq, batch, K] (default: five of vs_flashmla.py's).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import importlib
import json
import statistics

import numpy as np

MODULES = {name: f"jax_mla._src.pallas.mosaic.{name}"
           for name in ("kernel", "gather", "consumer", "decode", "pair")}
MODULES.update(merge="jax_mla._src.pallas.merge", plan="jax_mla._src.pallas.plan")
DEFAULT_SHAPES = [[128, 1, 128, 2048], [128, 1, 64, 512], [64, 1, 128, 2048], [64, 1, 64, 512],
                  [16, 4, 64, 2048]]


def parse_variant(text):
  """"NAME:MODULE.ATTR=VALUE[;MODULE.ATTR=VALUE...]" -> (name, [(module, attr, value)]). The
  attribute must exist (a typo would otherwise time the default under another name)."""
  name, sep, rest = text.partition(":")
  if not sep or not name or not rest:
    raise ValueError(f"a variant is NAME:MODULE.ATTR=VALUE; got {text!r}")
  overrides = []
  for item in rest.split(";"):
    target, sep, literal = item.partition("=")
    module_name, _, attr = target.strip().partition(".")
    if not sep or module_name not in MODULES or not attr:
      raise ValueError(f"an override is MODULE.ATTR=VALUE with MODULE one of {tuple(MODULES)}; got "
                       f"{item!r}")
    module = importlib.import_module(MODULES[module_name])
    if not hasattr(module, attr):
      raise ValueError(f"{module_name} has no attribute {attr!r}")
    overrides.append((module, attr, ast.literal_eval(literal.strip())))
  return name, overrides


@contextlib.contextmanager
def overridden(overrides):
  """Sets the overrides for the duration of the block, then restores every one."""
  saved = [(module, attr, getattr(module, attr)) for module, attr, _ in overrides]
  try:
    for module, attr, value in overrides:
      setattr(module, attr, value)
    yield
  finally:
    for module, attr, value in reversed(saved):
      setattr(module, attr, value)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--variant", action="append", default=[], type=parse_variant)
  parser.add_argument("--shapes", type=json.loads, default=DEFAULT_SHAPES)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--out", default=None)
  args = parser.parse_args(argv)
  variants = [("default", [])] + args.variant
  if len({name for name, _ in variants}) != len(variants):
    raise SystemExit("variant names must differ from each other and from 'default'")

  import jax  # pylint: disable=import-outside-toplevel
  import vs_flashmla as vf  # pylint: disable=import-outside-toplevel

  meta = dict(device=jax.devices()[0].device_kind, jax=jax.__version__,
              date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              method=f"vs_flashmla.py's: GPU busy time per call over {vf.STEPS} calls with "
                     f"changing indices, net of the loop's index update; the variants "
                     f"interleaved in each of {args.rounds} rounds, the median",
              variants={name: [f"{m.__name__.rsplit('.', 1)[1]}.{a}={v!r}"
                               for m, a, v in overrides] for name, overrides in variants})
  kv, kv_rope = vf.packed_pool()
  rows = []
  for shape in args.shapes:
    call_args = vf.call_args(shape)
    runs, outputs = {}, {}
    for name, overrides in variants:
      with overridden(overrides):  # traced and compiled here, with the overrides
        runs[name] = vf.looped(vf.decode_call(kv, kv_rope, shape[1], "pallas"))
        outputs[name] = np.asarray(runs[name](*call_args), np.float32)
    runs["index_update"] = vf.looped(vf.index_update)
    jax.block_until_ready(runs["index_update"](*call_args))
    times, kernels = vf.device_rounds(runs, call_args, args.rounds)
    update = statistics.median(times["index_update"])
    row = dict(heads=shape[0], tokens_per_seq=shape[1], batch=shape[2], k=shape[3],
               us={name: statistics.median(times[name]) - update for name, _ in variants},
               rounds={name: times[name] for name, _ in variants}, index_update_us=update,
               kernels={name: vf.rounded_kernels(kernels[name]) for name in runs},
               # Each variant's last output against the default's: a variant meant to change
               # only the speed should give the same numbers (0 where it keeps the arithmetic).
               finite={name: bool(np.isfinite(out).all()) for name, out in outputs.items()},
               max_abs_diff={name: float(np.abs(out - outputs["default"]).max())
                             for name, out in outputs.items()})
    rows.append(row)
    print(f"H{shape[0]}x{shape[1]} B{shape[2]} K{shape[3]}: " + ", ".join(
        f"{name} {us:.1f} us" for name, us in row["us"].items()) + "; max |diff| " + ", ".join(
            f"{name} {d:.3g}" for name, d in row["max_abs_diff"].items() if name != "default")
          + ("" if all(row["finite"].values()) else f"; NOT FINITE: {row['finite']}"), flush=True)
    if args.out:  # after every shape, so a run cut by a time limit keeps what it measured
      with open(args.out, "w") as out:
        json.dump(dict(meta=meta, rows=rows), out, indent=1)
  return rows


if __name__ == "__main__":
  main()
