"""How many KV splits the nm (split-plus-merge) kernel gets: a pure function of ints.

The split count fixes the shapes of the partial buffers, so it depends only on static shapes and
static ints, never on device values: one compiled executable serves every set of KV lengths.

Two pickers (KERNELS.md section 3):

- Occupancy (the default, aiter's pick): `bs_occ = num_seqs * ceil(H / 64)` workgroups per split;
  for i in 1..16, `score(i) = bs_occ*i / (ceil(bs_occ*i / cu) * cu)` (the fraction of the last
  wave of `cu` compute units that is busy); the highest score wins, ties to the smallest i.
- Latency model, used when `LATENCY_MODEL_COEFFS` has an entry for the arch. It ships EMPTY: the
  coefficients are fitted on hardware by a later change. Its form, for S splits and a KV length
  of `tiles` 32-token tiles:

      waves(S)   = ceil(bs_occ * S / cu)
      latency(S) = waves(S) * (wave_us + tile_us * ceil(tiles / S))      # attention
                 + [S > 1] * (partial_us * S + merge_us)                  # partial write + merge

  minimized over S in 1..max_splits, ties to the smallest S. Without a hint, `tiles` comes from
  the coefficients' `default_kv_len`.

A `kv_len_hint` (the KV length to plan for, e.g. a graph bucket's per-row capacity) caps the
split count at its tile count: more splits than 32-token tiles would leave splits empty.

The host backend plans for the CPU it runs on instead (`host_num_kv_splits`): its executor runs
one task per (sequence, split) with all of a sequence's heads, on one thread per CPU the process
may use, so the count only has to give the threads enough tasks to share; every further split
costs f32 partials `[T, S, H, 512]` written and merged.
"""

from __future__ import annotations

import dataclasses
import fractions
import math
import os

KV_TILE = 32  # the kernel's KV tile, in tokens
HEADS_PER_WORKGROUP = 64
MAX_SPLITS = 16
COMPUTE_UNITS = {"gfx950": 256}  # MI355X


@dataclasses.dataclass(frozen=True)
class LatencyCoeffs:
  """Fitted per-arch coefficients of the latency model (microseconds)."""
  wave_us: float
  tile_us: float
  partial_us: float
  merge_us: float
  default_kv_len: int
  max_splits: int = MAX_SPLITS


# arch -> LatencyCoeffs. Empty on purpose: fit on hardware before adding an entry.
LATENCY_MODEL_COEFFS: dict[str, LatencyCoeffs] = {}


# The host backend: tasks per thread it aims for (one: measured on 2 cores, 4 splits at batch 1
# were no faster than 2 at K 512-8192, and cost a larger merge), and the fewest KV entries worth
# a split of their own.
HOST_TASKS_PER_THREAD = 1
HOST_MIN_SPLIT_ENTRIES = 256


def host_threads() -> int:
  """CPUs this process may run on: what the host executor starts threads for."""
  try:
    return max(1, len(os.sched_getaffinity(0)))
  except (AttributeError, OSError):  # not Linux
    return max(1, os.cpu_count() or 1)


def _check_int(name: str, value, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, int):
    raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
  if value < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {value}")
  return value


def _check_batch(num_seqs, num_heads, kv_len_hint) -> None:
  """The arguments both pickers take: num_seqs and num_heads >= 1, kv_len_hint None or >= 0."""
  _check_int("num_seqs", num_seqs, 1)
  _check_int("num_heads", num_heads, 1)
  if kv_len_hint is not None:
    _check_int("kv_len_hint", kv_len_hint, 0)


def _occupancy_pick(bs_occ: int, cu: int, max_splits: int) -> int:
  best, best_score = 1, fractions.Fraction(-1)
  for i in range(1, max_splits + 1):
    work = bs_occ * i
    score = fractions.Fraction(work, math.ceil(work / cu) * cu)
    if score > best_score:  # strict: ties stay with the smaller i
      best, best_score = i, score
  return best


def _latency_pick(bs_occ: int, cu: int, tiles: int, c: LatencyCoeffs, max_splits: int) -> int:
  def latency(s: int) -> float:
    waves = math.ceil(bs_occ * s / cu)
    t = waves * (c.wave_us + c.tile_us * math.ceil(tiles / s))
    return t + (c.partial_us * s + c.merge_us if s > 1 else 0.0)
  return min(range(1, max_splits + 1), key=lambda s: (latency(s), s))


def num_kv_splits(num_seqs: int, num_heads: int, *, kv_len_hint: int | None = None,
                  arch: str = "gfx950") -> int:
  """The nm kernel's KV split count for a batch shape.

  Args:
    num_seqs: sequences in the batch (>= 1).
    num_heads: query heads (>= 1).
    kv_len_hint: optional KV length (tokens) to plan for; caps the count at ceil(hint / 32).
    arch: GPU arch; one of COMPUTE_UNITS.

  Returns:
    An int in 1..16.
  """
  _check_batch(num_seqs, num_heads, kv_len_hint)
  if not isinstance(arch, str) or arch not in COMPUTE_UNITS:
    raise ValueError(f"arch {arch!r} is not known to the split planner; known: "
                     f"{sorted(COMPUTE_UNITS)}")
  cu = COMPUTE_UNITS[arch]
  bs_occ = num_seqs * math.ceil(num_heads / HEADS_PER_WORKGROUP)
  max_splits = MAX_SPLITS
  if kv_len_hint is not None:
    max_splits = max(1, min(max_splits, math.ceil(kv_len_hint / KV_TILE)))
  coeffs = LATENCY_MODEL_COEFFS.get(arch)
  if coeffs is None:
    return _occupancy_pick(bs_occ, cu, max_splits)
  kv_len = coeffs.default_kv_len if kv_len_hint is None else kv_len_hint
  return _latency_pick(bs_occ, cu, math.ceil(kv_len / KV_TILE), coeffs,
                       min(max_splits, coeffs.max_splits))


def host_num_kv_splits(num_seqs: int, num_heads: int, *, kv_len_hint: int | None = None,
                       threads: int | None = None) -> int:
  """The host backend's KV split count: enough (sequence, split) tasks for the CPU's threads.

  `HOST_TASKS_PER_THREAD * threads` tasks at least and no more splits than that needs (one from
  as many sequences as threads: the executor merges its own splits and writes the LSE at any
  count); a `kv_len_hint` keeps each split at `HOST_MIN_SPLIT_ENTRIES` entries or more.
  num_heads does not matter: a task holds every head of its sequence.

  Args:
    num_seqs: sequences in the batch (>= 1).
    num_heads: query heads (>= 1).
    kv_len_hint: optional KV length to plan for.
    threads: the CPU threads to plan for; default `host_threads()`.

  Returns:
    An int in 1..16.
  """
  _check_batch(num_seqs, num_heads, kv_len_hint)
  threads = host_threads() if threads is None else _check_int("threads", threads, 1)
  splits = math.ceil(HOST_TASKS_PER_THREAD * threads / num_seqs)
  if kv_len_hint is not None:
    splits = min(splits, math.ceil(kv_len_hint / HOST_MIN_SPLIT_ENTRIES))
  return max(1, min(MAX_SPLITS, splits))
