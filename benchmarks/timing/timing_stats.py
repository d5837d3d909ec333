"""Comparing two sets of timings: medians and a two-sided significance test.

Mann-Whitney U through scipy when it is installed, else a permutation test on the difference of
medians in NumPy (seeded, so a report is reproducible). Used by benchmarks/gfx950_bench.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Comparison:
  median_a: float
  median_b: float
  ratio: float          # median_b / median_a
  p_value: float
  test: str

  def significant(self, alpha: float = 0.01) -> bool:
    return self.p_value < alpha


def permutation_p_value(a, b, *, rounds: int = 10000, seed: int = 0) -> float:
  """Two-sided p-value of |median(a) - median(b)| under random relabelling."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  observed = abs(np.median(a) - np.median(b))
  pooled = np.concatenate([a, b])
  rng = np.random.default_rng(seed)
  hits = 0
  for start in range(0, rounds, 1000):  # vectorised in blocks of 1000 relabellings
    n = min(1000, rounds - start)
    p = np.take(pooled, np.argsort(rng.random((n, len(pooled))), axis=1))
    diff = np.abs(np.median(p[:, :len(a)], axis=1) - np.median(p[:, len(a):], axis=1))
    hits += int(np.sum(diff >= observed))
  return (hits + 1) / (rounds + 1)  # never exactly 0: the observed labelling is one of them


def compare(a, b) -> Comparison:
  """Medians of a and b and a two-sided test that they differ."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if len(a) < 2 or len(b) < 2:
    raise ValueError("need at least 2 timings on each side")
  try:
    from scipy import stats  # pylint: disable=import-outside-toplevel
    p, test = float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue), "mann-whitney"
  except ImportError:
    p, test = permutation_p_value(a, b), "permutation"
  ma, mb = float(np.median(a)), float(np.median(b))
  return Comparison(ma, mb, mb / ma, p, test)
