"""The backend registry: every backend registers here once, and nothing else names backends.

Each entry says whether it can run here (`available() -> (ok, why)`), which (heads,
tokens_per_seq) layouts it serves for `decode` and `decode_persistent` (None: any), and its two
entry points, imported on first use so that no backend's code loads until it is asked for:

  decode(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, *, tokens_per_seq,
         num_kv_splits, return_lse, [softmax_scale, extra]) -> (out, lse or None)
  decode_persistent(q, q_rope, kv, kv_rope, kv_indptr, kv_indices, sink, workspace, *,
                    return_lse) -> (out, lse or None, workspace)

Both receive arguments already checked by the public API (`api.py`), sink as f32 [H], packed
Q and pools with the kernels' softmax scale and one source, except for what the backend lists in
`native` (NATIVE_FEATURES): those inputs it receives as the user gave them (bf16/f32 Q with
q_rope None, unquantized pools with kv_rope None, the `softmax_scale` and `extra=` keywords of
`decode`). The API does the rest for it (adapters.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from typing import Callable

import jax
# Not a backend's code: Pallas defines jax config options when first imported, and jax keys
# its trace caches on the config, so a first Pallas decode importing it inside a caller's
# jitted function made that function trace and compile a second time on its next call
# (tests/test_pallas_backend.py). Imported with the registry instead (about 0.06 s).
import jax.experimental.pallas  # pylint: disable=unused-import


Layouts = tuple[tuple[int, int], ...] | None


def _entry(module: str, name: str, **bound) -> Callable:
  """`module.name` (with `bound` keywords), imported at the first call."""
  def call(*args, **kwargs):
    return getattr(importlib.import_module(module), name)(*args, **bound, **kwargs)
  call.__name__ = call.__qualname__ = f"{module}.{name}"
  return call


def _aiter(name: str) -> Callable:
  return _entry("jax_mla._src.aiter.backend", name)


def _any_layout() -> Layouts:
  return None


# What a backend's `decode` entry may take as given (adapters.py says what the API does otherwise).
NATIVE_FEATURES = frozenset({"float_q", "float_kv", "softmax_scale", "extra"})


@dataclasses.dataclass(frozen=True)
class Backend:
  name: str
  available: Callable[[], tuple[bool, str]]
  decode_layouts: Callable[[], Layouts]
  persistent_layouts: Callable[[], Layouts]
  decode: Callable
  decode_persistent: Callable
  native: frozenset = frozenset()
  # Whether decode returns an LSE at num_kv_splits=1 (the nm kernel writes none; the host
  # executor, which merges its own splits, does).
  lse_at_one_split: bool = True
  # Whether jax.grad may run through it (plain JAX); else the API refuses (forward_only.py).
  differentiable: bool = False

  def __post_init__(self):
    unknown = set(self.native) - NATIVE_FEATURES
    if unknown:
      raise ValueError(f"backend {self.name!r}: unknown native features {sorted(unknown)}")


def _always() -> tuple[bool, str]:
  return True, "pure JAX runs on every platform"


REGISTRY: dict[str, Backend] = {b.name: b for b in (
    Backend("gfx950", available=_aiter("gfx950_available"), decode_layouts=_aiter("split_layouts"),
            persistent_layouts=_aiter("persistent_layouts"),
            decode=_entry("jax_mla._src.aiter.backend", "decode", backend="gfx950"),
            decode_persistent=_entry("jax_mla._src.aiter.backend", "decode_persistent",
                                     backend="gfx950"),
            lse_at_one_split=False),
    Backend("host", available=_aiter("host_available"), decode_layouts=_aiter("split_layouts"),
            persistent_layouts=_aiter("persistent_layouts"),
            decode=_entry("jax_mla._src.aiter.backend", "decode", backend="host"),
            decode_persistent=_entry("jax_mla._src.aiter.backend", "decode_persistent",
                                     backend="host")),
    # The Pallas kernels serve the layouts of the aiter split kernel: the ones DeepSeek-V4 uses
    # and the GPU tests cover. Its persistent entry runs its decode (any row count).
    Backend("pallas", available=_entry("jax_mla._src.pallas.backend", "available"),
            decode_layouts=_aiter("split_layouts"), persistent_layouts=_aiter("persistent_layouts"),
            decode=_entry("jax_mla._src.pallas.backend", "decode"),
            decode_persistent=_entry("jax_mla._src.pallas.backend", "decode_persistent"),
            # Both kernels apply the scale exactly, read both pools in one launch and read bf16
            # or f32 Q and pools themselves (computing in bf16).
            native=frozenset({"softmax_scale", "extra", "float_q", "float_kv"})),
    Backend("reference", available=_always, decode_layouts=_any_layout,
            persistent_layouts=_aiter("persistent_layouts"),
            decode=_entry("jax_mla._src.reference", "decode"),
            decode_persistent=_entry("jax_mla._src.reference", "decode_persistent"),
            native=NATIVE_FEATURES, differentiable=True),
)}
# What `backend=` accepts.
BACKENDS = ("auto", *REGISTRY)


def check_backend_name(backend) -> None:
  if backend not in BACKENDS:
    raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")


def host_available() -> tuple[bool, str]:
  return REGISTRY["host"].available()


def gfx950_available() -> tuple[bool, str]:
  return REGISTRY["gfx950"].available()


def explain_auto() -> tuple[str, str]:
  """(backend, reason) that backend="auto" resolves to for the default device: gfx950 where its
  code objects verify, pallas on other GPUs, host on a CPU, the reference elsewhere."""
  ok, why = gfx950_available()
  if ok:
    return "gfx950", why
  pallas_ok, pallas_why = REGISTRY["pallas"].available()
  if pallas_ok:
    return "pallas", f"{pallas_why} ({why})"
  default = jax.default_backend()
  if default == "cpu":
    ok, host_why = host_available()
    if ok:
      return "host", "the default device is a CPU and " + host_why
    return "reference", f"the default device is a CPU but the host backend is missing: {host_why}"
  return "reference", f"default platform {default!r}: {why}"


class MissingExtensionWarning(RuntimeWarning):
  """backend="auto" fell back to the reference on a CPU because the C++ extension is missing."""


def resolve(backend: str) -> Backend:
  """The backend `backend=` names ("auto" resolved); raises and says why where it cannot run."""
  check_backend_name(backend)
  if backend == "auto":
    chosen, why = explain_auto()
    if chosen == "reference" and jax.default_backend() == "cpu":
      # Loud: a source tree put on sys.path by accident has no extension, and the reference
      # is several times slower than the host backend.
      warnings.warn(f"jax_mla: backend='auto' runs the slower pure-JAX reference: {why}",
                    MissingExtensionWarning, stacklevel=3)
    return REGISTRY[chosen]
  entry = REGISTRY[backend]
  if backend in ("host", "pallas"):  # gfx950 says why at its first launch (no code object)
    ok, why = entry.available()
    if not ok:
      raise RuntimeError(f"backend={backend!r} cannot run: {why}")
  return entry


def check_layout(entry: Backend, layouts: Layouts, num_heads: int, tokens_per_seq: int) -> None:
  """Raises ValueError unless `entry` serves (num_heads, tokens_per_seq)."""
  if layouts is None or (num_heads, tokens_per_seq) in layouts:
    return
  pairs = ", ".join(f"({h}, {m})" for h, m in layouts)
  raise ValueError(
      f"backend={entry.name!r} serves (num_heads, tokens_per_seq) in {{{pairs}}}; got "
      f"({num_heads}, {tokens_per_seq}). backend='reference' serves any shape.")
