"""Comparing results with an oracle: non-finite masks first, then abs AND rel AND cosine."""

from __future__ import annotations

import numpy as np


def assert_close(name: str, actual, expected, *, atol: float, rtol: float,
                 cos_tol: float | None = 1e-5) -> None:
  """Fails unless every criterion holds.

  1. The non-finite pattern matches exactly (NaN where NaN, +-inf where +-inf): a NaN never
     counts as "close", and `abs(a - b) > tol` being False for NaN cannot hide one.
  2. On the finite elements: max |a - e| <= atol, AND the norm-wise relative error
     ||a - e|| / ||e|| <= rtol, AND (for vectors with energy) cosine similarity >= 1 - cos_tol.
  """
  a = np.asarray(actual, np.float64)
  e = np.asarray(expected, np.float64)
  assert a.shape == e.shape, f"{name}: shape {a.shape} != expected {e.shape}"
  a_bad, e_bad = ~np.isfinite(a), ~np.isfinite(e)
  if not np.array_equal(a_bad, e_bad):
    where = np.argwhere(a_bad != e_bad)[:5].tolist()
    raise AssertionError(
        f"{name}: non-finite pattern differs: {int(a_bad.sum())} non-finite vs "
        f"{int(e_bad.sum())} expected; first mismatches at {where}")
  if a_bad.any():
    assert np.array_equal(np.isnan(a), np.isnan(e)), f"{name}: NaN positions differ"
    both_inf = np.isinf(e)
    assert np.array_equal(a[both_inf], e[both_inf]), f"{name}: inf signs differ"
  fin = ~e_bad
  a, e = a[fin], e[fin]
  if a.size == 0:
    return
  err = np.abs(a - e)
  worst = int(np.argmax(err))
  assert err[worst] <= atol, (
      f"{name}: max abs error {err[worst]:.3g} > atol {atol:.3g} (actual {a[worst]!r}, "
      f"expected {e[worst]!r}, flat finite index {worst})")
  e_norm = np.linalg.norm(e)
  if e_norm > 0:
    rel = np.linalg.norm(a - e) / e_norm
    assert rel <= rtol, f"{name}: relative error {rel:.3g} > rtol {rtol:.3g}"
    if cos_tol is not None:
      a_norm = np.linalg.norm(a)
      cos = float(a @ e) / (a_norm * e_norm) if a_norm > 0 else 0.0
      assert cos >= 1 - cos_tol, f"{name}: cosine similarity {cos:.8f} < 1 - {cos_tol:g}"
  else:
    assert np.all(a == 0), f"{name}: expected all zeros, got max |a| = {np.max(np.abs(a))}"


def assert_bf16_decode_close(out, lse, want_out, want_lse) -> None:
  """A decode with bf16 output (and bf16 softmax weights in the PV product) against the float64
  oracle: out within a few bf16 ulps of its largest finite value, lse (when not None) within
  2e-4 of its own. Non-finite positions must match first (assert_close)."""
  scale = max(np.abs(want_out[np.isfinite(want_out)]).max(initial=0.0), 1e-30)
  assert_close("out", out, want_out, atol=scale * 2.0**-7, rtol=2.0**-8, cos_tol=1e-5)
  if lse is not None:
    finite = want_lse[np.isfinite(want_lse)]
    assert_close("lse", lse, want_lse, atol=2e-4 * max(1.0, np.abs(finite).max(initial=1.0)),
                 rtol=1e-5, cos_tol=None)


def _bits(x) -> np.ndarray:
  """Floats (bf16 included) as their bit patterns, so identity is exact, NaN payloads too."""
  x = np.asarray(x)
  if x.dtype.kind in "fV" or x.dtype.name == "bfloat16":
    return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])
  return x


def assert_bit_identical(name: str, actual, expected, *, what: str = "the expected result"):
  """Fails unless shapes and dtypes match and every element is bit-for-bit identical."""
  a, e = np.asarray(actual), np.asarray(expected)
  assert a.shape == e.shape, f"{name}: shape {a.shape} != {e.shape}"
  assert a.dtype == e.dtype, f"{name}: dtype {a.dtype} != {e.dtype}"
  assert np.array_equal(_bits(a), _bits(e)), f"{name} differs from {what}"
