"""One shape's public decode, called a few times on the timed runs' data, for Nsight Compute to
profile one launch (the first call compiles):

  ncu --set full --import-source yes -k regex:mosaic --launch-skip 1 --launch-count 1 \\
      -o REPORT python benchmarks/ncu_decode.py 128 1 128 2048
  ncu -i REPORT.ncu-rep --page details > DETAILS.txt
  ncu -i REPORT.ncu-rep --page source --csv --print-source sass > SOURCE.csv  # ncu_roles.py's

The pool, Q, sink and index lists are vs_flashmla.py's for the shape (its first call's indices),
so a profile matches a row of its table.

Usage (from the repository root): PYTHONPATH=src:benchmarks python benchmarks/ncu_decode.py
    HEADS TOKENS_PER_SEQ BATCH K [--backend pallas] [--calls 2]
"""

from __future__ import annotations

import argparse

import vs_flashmla


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("shape", nargs=4, type=int, metavar=("HEADS", "TOKENS", "BATCH", "K"))
  parser.add_argument("--backend", default="pallas")
  parser.add_argument("--calls", type=int, default=2)
  args = parser.parse_args(argv)
  if args.calls < 1:
    parser.error("--calls must be at least 1")
  import jax  # pylint: disable=import-outside-toplevel

  kv, kv_rope = vs_flashmla.packed_pool()
  call = jax.jit(vs_flashmla.decode_call(kv, kv_rope, args.shape[1], args.backend))
  call_args = vs_flashmla.call_args(tuple(args.shape))
  for _ in range(args.calls):
    out = jax.block_until_ready(call(*call_args))
  print(f"{args.calls} calls of the {args.backend} decode at heads x tokens {args.shape[0]} x "
        f"{args.shape[1]}, batch {args.shape[2]}, K {args.shape[3]}: out {out.shape} "
        f"{out.dtype} on {jax.devices()[0].device_kind}")
  return out


if __name__ == "__main__":
  main()
