"""backend="pallas": the Pallas GPU kernels behind `decode` and `decode_persistent`.

On an sm90 (Hopper) CUDA GPU the Mosaic GPU kernel (`mosaic_decode`: wgmma, TMA, warp
specialization); on other CUDA GPUs and on ROCm GPUs the Triton-lowered kernel
(`pallas.triton`). `"auto"` picks it on GPUs without verified gfx950 code objects (its speed
floor, 3x plain XLA at batch >= 64 and no slower anywhere, held at every shape measured on an
H200, 2026-12-03: benchmarks/README.md). Both kernels hold the decode contracts (lse with
the sink, empty rows, padding never read, one executable for every set of lengths), take a
softmax scale applied in the kernel, read a second KV source (`extra`) in the same launch, and
read bf16/f32 Q and bf16/f32 pools as given (computed with as bf16).
"""

from __future__ import annotations

import jax

from jax_mla._src import platform

def kernel_for(device) -> tuple[str | None, str]:
  """(which Pallas kernel serves `device`, or None; why)."""
  vendor = platform.gpu_vendor(device)
  if vendor == "cuda":
    capability = str(getattr(device, "compute_capability", ""))
    if capability.startswith("9."):
      return "mosaic", f"a CUDA GPU of compute capability {capability}: the Mosaic GPU kernel"
    return "triton", (f"a CUDA GPU of compute capability {capability or 'unknown'} (the "
                      "Mosaic GPU kernel needs 9.x): the Triton kernel")
  if vendor == "rocm":
    return "triton", "a ROCm GPU: the Triton kernel"
  return None, (f"the default device is {getattr(device, 'platform', device)!r}; "
                "backend='pallas' needs a CUDA or ROCm GPU")


def device_kernel() -> tuple[str | None, str]:
  """`kernel_for` the default device. (Tests on the CPU swap this, and `_interpret`, to run the
  whole backend with the Triton kernel in interpret mode.)"""
  return kernel_for(jax.devices()[0])


def available() -> tuple[bool, str]:
  kernel, why = device_kernel()
  return kernel is not None, why


def default_kernel() -> str:
  """The kernel for the default device; raises RuntimeError where there is none."""
  kernel, why = device_kernel()
  if kernel is None:
    raise RuntimeError(f"backend='pallas' cannot run: {why}")
  return kernel


def decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, *, tokens_per_seq: int,
           num_kv_splits: int | None, return_lse: bool, softmax_scale: float | None = None,
           extra=None):
  """`jax_mla.decode` on the Pallas backend; arguments validated (at least one sequence),
  sink f32 [H]. softmax_scale: a Python float, None for 1/sqrt(512), applied in the kernel.
  extra: None or a second source (kv2, kv_rope2, kv_indptr2, kv_indices2) laid out like the
  first, read by the same kernel (one softmax over both, one sink); num_kv_splits then counts
  the splits of both sources' entries together."""
  if default_kernel() == "mosaic":
    from jax_mla._src.pallas.mosaic import decode as mosaic_decode  # pylint: disable=import-outside-toplevel
    return mosaic_decode.mosaic_decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink,
                                       tokens_per_seq=tokens_per_seq,
                                       num_kv_splits_=num_kv_splits, return_lse=return_lse,
                                       softmax_scale=softmax_scale, extra=extra)
  from jax_mla._src.pallas import triton as pallas_decode  # pylint: disable=import-outside-toplevel
  return pallas_decode.pallas_decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink,
                                     tokens_per_seq=tokens_per_seq, num_kv_splits=num_kv_splits,
                                     return_lse=return_lse, softmax_scale=softmax_scale,
                                     extra=extra, interpret=_interpret())


def decode_persistent(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, workspace, *,
                      return_lse: bool):
  """`jax_mla.decode_persistent` on the Pallas backend (at least one row): the same decode,
  one token per row.
  The gfx950 kernel's workspace is not needed; it is returned unchanged, so a model written
  against the persistent API keeps its data dependence and runs unmodified."""
  out, lse = decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, tokens_per_seq=1,
                    num_kv_splits=None, return_lse=return_lse)
  return out, lse, workspace


def _interpret() -> bool:
  """Pallas interpret mode for the Triton kernel: off on a GPU (see device_kernel)."""
  return False
