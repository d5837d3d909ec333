"""Where the Mosaic GPU kernel goes wrong: its error against the float64 oracle on inputs that
switch parts of the decode off, per range of output columns. Needs an sm90 GPU.

Usage: python benchmarks/mosaic_diagnose.py [base] [qzero] [unitscale] [ropeonly] [nopeonly]

Each variant of the kernel (VARIANTS below) runs on each input.

- base: random rows (tests/rows.py), 64 heads, lengths 130 / 0 / 7, one split.
- qzero: Q = 0, so the softmax is uniform and the output is the mean of the V rows: checks the
  dequantized values and PV without QK.
- unitscale: every KV tile scale 1 (e8m0 byte 127): checks the fp8 values without the scales.
- ropeonly / nopeonly: the NoPE bytes (or the RoPE values) zero.

Output columns [0:256] and [256:448] are the NoPE (each consumer warpgroup's half), [448:512]
the RoPE. On the H200 (2026-12-02) this located the kernel's wrong NoPE values: with the tile
scales decoded by XLA and loaded from global memory, and each row staged by one tensor-map TMA,
every input with NoPE values was wrong (qzero: NoPE off by up to 5.8 where the largest value is
5.8); with the scales read from the staged rows, or with each row staged as four 64-word
copies, all five inputs matched (max error 0.06 on values up to 24). The kernel now reads the
scales from the staged rows (results/h200_2026-12-02_mosaic_diagnose.txt). (That was the staged
design, removed on 2026-12-03; the variants are now the default and the S exchange.)
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, "tests")
sys.path.insert(0, ".")
from oracle import oracle_decode  # noqa: E402  pylint: disable=wrong-import-position
from rows import make_batch  # noqa: E402  pylint: disable=wrong-import-position
from jax_mla._src import mosaic_decode as md  # noqa: E402  pylint: disable=wrong-import-position


def variant(name):
  batch = make_batch(np.random.default_rng(3), num_heads=64, lengths=[130, 0, 7], sink=0.3)
  if name == "qzero":
    batch.q[..., :448] = 0
    batch.q_rope[...] = 0
  elif name == "unitscale":
    batch.kv[:, 448:462] = 127
  elif name == "ropeonly":
    batch.kv[:, :448] = 0
  elif name == "nopeonly":
    batch.kv_rope[...] = 0
  elif name != "base":
    raise ValueError(name)
  return batch


def main(names, config):
  decode = jax.jit(lambda *a: md.mosaic_decode(*a, tokens_per_seq=1, num_kv_splits_=1,
                                               config=config))
  print(config, flush=True)
  for name in names:
    batch = variant(name)
    out, lse = decode(*batch.args())
    out = np.asarray(jnp.asarray(out, jnp.float32))
    want_out, want_lse = oracle_decode(*batch.args(), 1)
    parts = []
    for lo, hi in ((0, 256), (256, 448), (448, 512)):
      err = np.abs(out[..., lo:hi] - want_out[..., lo:hi]).max()
      parts.append(f"[{lo}:{hi}] max err {err:.3g} (max |want| "
                   f"{np.abs(want_out[..., lo:hi]).max():.3g})")
    lse_err = [float(np.nanmax(np.abs(np.asarray(lse)[t] - want_lse[t]))) for t in range(3)]
    print(name, "finite" if np.isfinite(out).all() else "NOT FINITE", " ".join(parts),
          "lse err per sequence", [f"{e:.3g}" for e in lse_err], flush=True)


VARIANTS = (md.MosaicConfig(), md.MosaicConfig(consumers="s_exchange"))

if __name__ == "__main__":
  for config in VARIANTS:
    main(sys.argv[1:] or ["base", "qzero", "unitscale", "ropeonly", "nopeonly"], config)
