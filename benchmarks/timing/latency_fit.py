"""Fitting the split planner's latency model to measured times, and the per-arch table file.

The model (planner.py) is linear in its four coefficients, so a least-squares fit over measured
(num_seqs, H, K, S, latency) points recovers them:

    latency = wave_us * waves + tile_us * waves * ceil(tiles / S)
            + partial_us * [S > 1] * S + merge_us * [S > 1]
    waves = ceil(num_seqs * ceil(H / 64) * S / cu),  tiles = ceil(K / 32)

The table is JSON, {"format": FORMAT, "coeffs": {arch: {field: value}}, "fits": {arch: {...}}};
`load_table` returns planner.LatencyCoeffs per arch, ready for planner.LATENCY_MODEL_COEFFS.
Pure NumPy: tested on CPU with synthetic timings (the measurements need an MI355X).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

from jax_mla._src.aiter import planner

FORMAT = "jax_mla.latency_coeffs.v1"
COEFF_NAMES = ("wave_us", "tile_us", "partial_us", "merge_us")


@dataclasses.dataclass(frozen=True)
class Measurement:
  num_seqs: int
  num_heads: int
  kv_len: int
  num_splits: int
  latency_us: float


@dataclasses.dataclass(frozen=True)
class Fit:
  coeffs: planner.LatencyCoeffs
  num_points: int
  rms_relative_error: float   # sqrt(mean(((model - measured) / measured)^2))
  max_relative_error: float


def features(m: Measurement, cu: int) -> np.ndarray:
  """The model's four regressors for one measurement (the columns match COEFF_NAMES)."""
  bs_occ = m.num_seqs * math.ceil(m.num_heads / planner.HEADS_PER_WORKGROUP)
  waves = math.ceil(bs_occ * m.num_splits / cu)
  tiles = math.ceil(m.kv_len / planner.KV_TILE)
  split = 1.0 if m.num_splits > 1 else 0.0
  return np.array([waves, waves * math.ceil(tiles / m.num_splits), split * m.num_splits, split],
                  np.float64)


def predict(coeffs: planner.LatencyCoeffs, m: Measurement, cu: int) -> float:
  return float(features(m, cu) @ np.array([getattr(coeffs, n) for n in COEFF_NAMES]))


def fit(measurements, *, arch: str = "gfx950", default_kv_len: int,
        max_splits: int = planner.MAX_SPLITS) -> Fit:
  """Least squares (relative error: each row weighted by 1/latency) over the measurements.

  Raises ValueError when the sweep cannot determine every coefficient (e.g. no S > 1 points, or
  one S only), or a coefficient comes out negative (the model does not describe the data).
  """
  measurements = list(measurements)
  cu = planner.COMPUTE_UNITS[arch]
  if not measurements:
    raise ValueError("no measurements to fit")
  for m in measurements:
    if not (m.latency_us > 0 and math.isfinite(m.latency_us)):
      raise ValueError(f"latency must be positive and finite: {m}")
  x = np.stack([features(m, cu) for m in measurements])
  y = np.array([m.latency_us for m in measurements])
  w = 1.0 / y  # relative error: a 10 us call and a 1 ms call count alike
  rank = np.linalg.matrix_rank(x * w[:, None])
  if rank < len(COEFF_NAMES):
    raise ValueError(f"the sweep determines only {rank} of the {len(COEFF_NAMES)} coefficients "
                     f"{COEFF_NAMES}: vary num_seqs, KV length and split count (with S = 1 and "
                     "several S > 1)")
  beta, *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
  if np.any(beta < 0):
    bad = {n: float(b) for n, b in zip(COEFF_NAMES, beta) if b < 0}
    raise ValueError(f"negative latency coefficients {bad}: the model does not fit these "
                     "measurements")
  coeffs = planner.LatencyCoeffs(*map(float, beta), default_kv_len=int(default_kv_len),
                                 max_splits=int(max_splits))
  rel = (x @ beta - y) / y
  return Fit(coeffs, len(y), float(np.sqrt(np.mean(rel**2))), float(np.max(np.abs(rel))))


def table_json(fits: dict[str, Fit]) -> str:
  """The per-arch table as JSON text."""
  return json.dumps({
      "format": FORMAT,
      "coeffs": {arch: dataclasses.asdict(f.coeffs) for arch, f in fits.items()},
      "fits": {arch: {"num_points": f.num_points, "rms_relative_error": f.rms_relative_error,
                      "max_relative_error": f.max_relative_error} for arch, f in fits.items()},
  }, indent=2, sort_keys=True) + "\n"


def load_table(text: str) -> dict[str, planner.LatencyCoeffs]:
  """Parses and validates a table written by table_json; arch -> LatencyCoeffs."""
  data = json.loads(text)
  if not isinstance(data, dict) or data.get("format") != FORMAT:
    raise ValueError(f"not a latency-coefficient table (format must be {FORMAT!r})")
  out = {}
  fields = {f.name for f in dataclasses.fields(planner.LatencyCoeffs)}
  for arch, entry in data.get("coeffs", {}).items():
    if arch not in planner.COMPUTE_UNITS:
      raise ValueError(f"arch {arch!r} is not known to the planner ({sorted(planner.COMPUTE_UNITS)})")
    if set(entry) != fields:
      raise ValueError(f"{arch}: fields {sorted(entry)} != {sorted(fields)}")
    for name in COEFF_NAMES:
      v = entry[name]
      if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{arch}.{name} must be a finite number >= 0, got {v!r}")
    for name in ("default_kv_len", "max_splits"):
      if not isinstance(entry[name], int) or isinstance(entry[name], bool) or entry[name] < 1:
        raise ValueError(f"{arch}.{name} must be an int >= 1, got {entry[name]!r}")
    if entry["max_splits"] > planner.MAX_SPLITS:
      raise ValueError(f"{arch}.max_splits must be <= {planner.MAX_SPLITS}")
    out[arch] = planner.LatencyCoeffs(**entry)
  return out
