"""The persistent kernel's workspace: caller-owned buffers, passed in and handed back.

A `Workspace` is a pytree of five arrays. `decode_persistent` takes it as an operand that XLA
aliases to an output, so two calls sharing one workspace are ordered by data dependence (the
kernel's "ordered calls only" rule holds by construction) and, donated under jit, no copy is
made. See docs/workspace.md.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_mla._src import layout

NUM_HEADS = 128
MAX_ROWS = 32768          # the kernel's byte offsets wrap above it
MAX_PARTITIONS = 1024
# Arrival counters and planner scratch, fixed by the kernel: 2*65536 + 16*512 + 4*1024.
CNT_ENTRIES = 2 * 65536 + 16 * 512 + 4 * 1024
DESC_WIDTH = 8


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Workspace:
  """Buffers of the nm_ps kernel; make one with `make_workspace`.

  o_acc:   f32 [2P, 128, 512]  partial outputs, two slots per partition
  lse_acc: f32 [2P, 128]       partial log2 denominators, no sink
  desc:    i32 [P, 8]          per-partition work descriptors (written by the kernel)
  cnt:     u32 [143360]        arrival counters; zero at rest, after every completed call
  arange:  i32 [max_rows + 1]  0, 1, 2, ... (the kernel's qo_indptr and split_indptr)
  """

  o_acc: jax.Array
  lse_acc: jax.Array
  desc: jax.Array
  cnt: jax.Array
  arange: jax.Array

  @property
  def num_partitions(self) -> int:
    return int(self.desc.shape[0])

  @property
  def max_rows(self) -> int:
    return int(self.arange.shape[0]) - 1

  @property
  def nbytes(self) -> int:
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in self._arrays())

  @property
  def size_text(self) -> str:
    """Readable size, e.g. '64.7 MiB (o_acc 64.0 MiB)'."""
    return f"{_mib(self.nbytes)} (o_acc {_mib(_nbytes(self.o_acc))})"

  def _arrays(self):
    return (self.o_acc, self.lse_acc, self.desc, self.cnt, self.arange)

  def __repr__(self) -> str:
    return (f"Workspace(num_partitions={self.num_partitions}, max_rows={self.max_rows}, "
            f"{self.size_text})")


def _nbytes(a) -> int:
  return int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize


def _mib(n: int) -> str:
  return f"{n / 2**20:.1f} MiB"


def check_partitions(num_partitions, allow_any_partitions: bool = False) -> None:
  if isinstance(num_partitions, bool) or not isinstance(num_partitions, (int, np.integer)):
    raise TypeError(f"num_partitions must be an int, got {type(num_partitions).__name__}")
  if not 1 <= num_partitions <= MAX_PARTITIONS:
    raise ValueError(f"num_partitions must be in [1, {MAX_PARTITIONS}], got {num_partitions}")
  if num_partitions % 8 and not allow_any_partitions:
    raise ValueError(
        f"num_partitions must be a multiple of 8, got {num_partitions}: the kernel uses its "
        "XCD-aware workgroup map (spreading each partition's work over the 8 XCDs of an MI355X) "
        "only when P % 8 == 0. Pass allow_any_partitions=True to use another count anyway.")


def make_workspace(num_partitions: int = 128, max_rows: int = MAX_ROWS, *,
                   allow_any_partitions: bool = False) -> Workspace:
  """A zeroed workspace for `decode_persistent` with P = num_partitions, N <= max_rows.

  Args:
    num_partitions: P, the kernel's work partitions (1..1024; a multiple of 8 unless
      `allow_any_partitions=True`).
    max_rows: the most query rows N a call may have (1..32768).
    allow_any_partitions: accept a P that is not a multiple of 8.

  Returns:
    A `Workspace` of device arrays: o_acc f32 `[2P, 128, 512]`, lse_acc f32 `[2P, 128]`,
    desc int32 `[P, 8]`, cnt uint32 `[143360]` (zero), arange int32 `[max_rows + 1]`.

  Memory: 2P*128*512*4 bytes of o_acc (64 MiB at P = 128, 512 MiB at P = 1024) plus about
  0.6 MiB of counters and max_rows*4 bytes of arange. See docs/workspace.md.
  """
  check_partitions(num_partitions, allow_any_partitions)
  if isinstance(max_rows, bool) or not isinstance(max_rows, (int, np.integer)):
    raise TypeError(f"max_rows must be an int, got {type(max_rows).__name__}")
  if not 1 <= max_rows <= MAX_ROWS:
    raise ValueError(f"max_rows must be in [1, {MAX_ROWS}] (the kernel's limit on rows), "
                     f"got {max_rows}")
  p = int(num_partitions)
  return Workspace(
      o_acc=jnp.zeros((2 * p, NUM_HEADS, layout.HEAD_DIM), jnp.float32),
      lse_acc=jnp.zeros((2 * p, NUM_HEADS), jnp.float32),
      desc=jnp.zeros((p, DESC_WIDTH), jnp.int32),
      cnt=jnp.zeros((CNT_ENTRIES,), jnp.uint32),
      arange=jnp.arange(int(max_rows) + 1, dtype=jnp.int32),
  )


def reset_workspace(workspace: Workspace) -> Workspace:
  """Zeroes the counters (and descriptors) after a call that did not complete; traceable.

  Args:
    workspace: a `Workspace` (arrays or tracers), e.g. the one passed to a call that raised.

  Returns:
    A `Workspace` of the same shapes with cnt (uint32 `[143360]`) and desc (int32 `[P, 8]`)
    zeroed; o_acc, lse_acc and arange are passed through unchanged.
  """
  check_workspace(workspace)
  return dataclasses.replace(workspace, cnt=jnp.zeros_like(workspace.cnt),
                             desc=jnp.zeros_like(workspace.desc))


def check_workspace(workspace, *, allow_any_partitions: bool = True) -> None:
  """Raises TypeError/ValueError unless `workspace` is a consistent Workspace (arrays or tracers).

  P % 8 is not enforced here by default: make_workspace already decided that.
  """
  if not isinstance(workspace, Workspace):
    raise TypeError("workspace must be a jax_mla Workspace (from jax_mla.make_workspace), got "
                    f"{type(workspace).__name__}")
  desc = workspace.desc
  if len(desc.shape) != 2 or desc.shape[1] != DESC_WIDTH:
    raise ValueError(f"workspace.desc must have shape [P, {DESC_WIDTH}], got {tuple(desc.shape)}")
  p = int(desc.shape[0])
  check_partitions(p, allow_any_partitions)
  arange = workspace.arange
  if len(arange.shape) != 1 or not 2 <= arange.shape[0] <= MAX_ROWS + 1:
    raise ValueError(f"workspace.arange must have shape [max_rows + 1] with 1 <= max_rows <= "
                     f"{MAX_ROWS}, got {tuple(arange.shape)}")
  expected = {
      "o_acc": ((2 * p, NUM_HEADS, layout.HEAD_DIM), jnp.float32),
      "lse_acc": ((2 * p, NUM_HEADS), jnp.float32),
      "desc": ((p, DESC_WIDTH), jnp.int32),
      "cnt": ((CNT_ENTRIES,), jnp.uint32),
      "arange": (tuple(arange.shape), jnp.int32),
  }
  for name, (shape, dtype) in expected.items():
    a = getattr(workspace, name)
    if tuple(a.shape) != shape or a.dtype != dtype:
      raise ValueError(
          f"workspace.{name} must be {np.dtype(dtype).name}{list(shape)} for P={p} partitions "
          f"(taken from desc), got {np.dtype(a.dtype).name}{list(a.shape)}")
