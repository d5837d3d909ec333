"""Finding AMD's gfx950 code objects on the user's machine and verifying them before any launch.

jax_mla never ships the code objects: they come from AMD's aiter. For each kernel of the manifest
the search tries, in order:

1. the directory given to `set_code_object_dir(path)`;
2. the directory in the environment variable JAX_MLA_HSA_DIR;
3. an aiter installation or checkout, located without importing aiter (or torch).

A location that lacks the file is skipped. The first file found is verified; if it is refused
the search stops there with an error carrying the verdict, rather than quietly using a file from
a later location that the user did not point at.

Verification (`verify_code_object`) checks the ELF and its AMDGPU metadata against the manifest
entry, then the sha256: a known hash is "verified"; an unknown hash that passed every check is
"unrecognized-build" (used, with an `UnrecognizedCodeObjectWarning`); any failed check is
"refused". Verdicts are cached per (path, size, mtime, entry).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from jax_mla._src.aiter.code_objects import elf as amdgpu_elf
from jax_mla._src.aiter.code_objects import manifest as manifest_lib

ENV_VAR = "JAX_MLA_HSA_DIR"

Status = Literal["verified", "unrecognized-build", "refused"]
Source = Literal["set_code_object_dir", "JAX_MLA_HSA_DIR", "aiter"]

# aiter's setup.py copies its hsa/ tree into a sibling package `aiter_meta` for wheel installs;
# editable installs and checkouts keep hsa/ next to the `aiter` package directory.
_AITER_PACKAGE = "aiter"
_AITER_META_PACKAGE = "aiter_meta"
_AITER_DISTRIBUTIONS = ("amd-aiter", "aiter")


class CodeObjectError(RuntimeError):
  """No usable code object: none was found (the message lists every place searched), or the one
  found was refused (the message carries its verdict)."""

  def __init__(self, message: str, *, kernel_id: str, searched: tuple[str, ...],
               verdict: Verdict | None = None):
    super().__init__(message)
    self.kernel_id = kernel_id
    self.searched = searched
    self.verdict = verdict


class UnrecognizedCodeObjectWarning(UserWarning):
  """A code object passed every ABI check but its sha256 is not a build the manifest knows."""


@dataclasses.dataclass(frozen=True)
class Verdict:
  """The outcome of verifying one file against one manifest entry.

  `check` names the failed check when refused ("readable", "elf-magic", "elf-class",
  "elf-header", "section-headers", "e_machine", "mach", "metadata-note", "kernel-in-metadata",
  "kernarg_segment_size", "reqd_workgroup_size", "wavefront_size", "symbol-table"), else None.
  `sha256` is None only when the file could not be read. `message` names the file.
  """
  status: Status
  path: str
  kernel_id: str
  message: str
  sha256: str | None = None
  check: str | None = None
  known_build_note: str | None = None

  @property
  def usable(self) -> bool:
    return self.status != "refused"


@dataclasses.dataclass(frozen=True)
class FoundCodeObject:
  """A usable code object: where it is, which search step found it, and its verdict."""
  kernel_id: str
  path: Path
  source: Source
  verdict: Verdict


@dataclasses.dataclass(frozen=True)
class Discovery:
  """What the search gives for one manifest kernel, for `python -m jax_mla info`.

  `status` is the verdict's status, or "missing" when no file was found.
  """
  kernel_id: str
  file: str
  status: Status | Literal["missing"]
  path: str | None
  source: Source | None
  message: str

  def describe(self) -> str:
    where = f"{self.path} (from {self.source})" if self.path else "not found"
    return f"{self.kernel_id}: {self.status}: {where}\n  {self.message}"


class _Refused(Exception):
  def __init__(self, check: str, detail: str):
    super().__init__(detail)
    self.check = check
    self.detail = detail


_lock = threading.Lock()
_code_object_dir: Path | None = None
_verdicts: dict[tuple[str, int, int, manifest_lib.KernelEntry], Verdict] = {}


def set_code_object_dir(path: str | os.PathLike[str] | None) -> None:
  """Makes `path` the first place searched for AMD's gfx950 code objects.

  Args:
    path: a directory holding the `.co` files directly (e.g. aiter's `hsa/gfx950/mla_v4`), or None
      to remove the setting. Searched before `$JAX_MLA_HSA_DIR` and aiter installs
      (docs/code_objects.md).

  Every cached verdict is forgotten, so the next lookup re-finds and re-verifies its file.
  Process-wide; returns None. Raises NotADirectoryError when `path` is not an existing directory.
  """
  global _code_object_dir
  directory = None
  if path is not None:
    directory = Path(path).expanduser()
    if not directory.is_dir():
      raise NotADirectoryError(f"set_code_object_dir: {directory} is not a directory")
    directory = directory.resolve()
  with _lock:
    _code_object_dir = directory
    _verdicts.clear()


def code_object_dir() -> Path | None:
  """The directory set by `set_code_object_dir`, or None."""
  return _code_object_dir


def clear_cache() -> None:
  """Forgets every cached verdict, so the next lookup re-reads and rehashes the files."""
  with _lock:
    _verdicts.clear()


def _describe_value(value: object) -> str:
  return "absent" if value is None else repr(value)


def _check_image(image: bytes, entry: manifest_lib.KernelEntry) -> None:
  """Raises _Refused at the first check the image fails; returns when it passes them all."""
  try:
    header = amdgpu_elf.read_header(image)
    if header.e_machine != amdgpu_elf.EM_AMDGPU:
      raise _Refused("e_machine", f"expected EM_AMDGPU ({amdgpu_elf.EM_AMDGPU}), found "
                     f"e_machine {header.e_machine}")
    expected_mach = amdgpu_elf.MACH_BY_NAME[entry.arch]
    if header.mach != expected_mach:
      found = header.arch or "an unknown processor"
      raise _Refused("mach", f"expected {entry.arch} (e_flags & 0xff == {expected_mach:#04x}), "
                     f"found {found} ({header.mach:#04x}; e_flags {header.e_flags:#x})")
    metadata = amdgpu_elf.read_metadata(image, header)
    if metadata is None:
      raise _Refused("metadata-note", "the file has no NT_AMDGPU_METADATA note (an \"AMDGPU\" "
                     f"note of type {amdgpu_elf.NT_AMDGPU_METADATA})")
    kernels = amdgpu_elf.kernels_in(metadata)
    matching = [k for k in kernels if k.names(entry.symbol)]
    if not matching:
      listed = [k.name if k.name is not None else k.symbol for k in kernels]
      raise _Refused("kernel-in-metadata", f"expected a kernel {entry.symbol} (.symbol "
                     f"{entry.symbol}.kd) in amdhsa.kernels, found {listed}")
    kernel = matching[0]
    if kernel.kernarg_segment_size != entry.kernarg_size:
      raise _Refused("kernarg_segment_size", f"expected .kernarg_segment_size "
                     f"{entry.kernarg_size}, found {_describe_value(kernel.kernarg_segment_size)}")
    if not isinstance(kernel.reqd_workgroup_size, list) or tuple(
        kernel.reqd_workgroup_size) != entry.block:
      raise _Refused("reqd_workgroup_size", f"expected .reqd_workgroup_size {list(entry.block)}, "
                     f"found {_describe_value(kernel.reqd_workgroup_size)}")
    if kernel.wavefront_size != entry.wavefront:
      raise _Refused("wavefront_size", f"expected .wavefront_size {entry.wavefront}, found "
                     f"{_describe_value(kernel.wavefront_size)}")
    symbols = amdgpu_elf.read_symbol_names(image, header)
    missing = [s for s in (entry.symbol, entry.symbol + ".kd") if s not in symbols]
    if missing:
      raise _Refused("symbol-table", f"expected the symbols {missing} in .symtab/.dynsym; the "
                     f"metadata names the kernel but the file does not define it")
  except amdgpu_elf.ElfFormatError as e:
    raise _Refused(e.check, str(e)) from e


def verify_image(image: bytes, path: str | os.PathLike[str],
                 entry: manifest_lib.KernelEntry) -> Verdict:
  """Verifies code-object bytes against `entry`; pure (no I/O, no warning, no cache).

  `path` only labels the messages. Returns a Verdict whose status is "refused" (with `check`
  naming the first failed check, and expected vs found in the message), "verified" (a known
  sha256), or "unrecognized-build" (every check passed, unknown sha256).
  """
  path = str(path)
  sha256 = hashlib.sha256(image).hexdigest()
  try:
    _check_image(image, entry)
  except _Refused as refusal:
    return Verdict(
        status="refused", path=path, kernel_id=entry.id, sha256=sha256, check=refusal.check,
        message=(f"{path}: refused as the {entry.id} code object: check '{refusal.check}' "
                 f"failed: {refusal.detail}"))
  known = entry.known_build(sha256)
  if known is not None:
    return Verdict(status="verified", path=path, kernel_id=entry.id, sha256=sha256,
                   known_build_note=known.note,
                   message=f"{path}: verified: sha256 {sha256} is a known build ({known.note})")
  return Verdict(
      status="unrecognized-build", path=path, kernel_id=entry.id, sha256=sha256,
      message=(f"{path}: sha256 {sha256} is not a known build of {entry.id}; it passed every ABI "
               f"check ({entry.arch}, {entry.symbol}, kernarg {entry.kernarg_size}, block "
               f"{list(entry.block)}, wavefront {entry.wavefront}) and will be used. Known builds: "
               f"{', '.join(sorted(entry.known_hashes)) or 'none'}"))


def verify_code_object(path: str | os.PathLike[str],
                       entry: manifest_lib.KernelEntry) -> Verdict:
  """Reads and verifies the file at `path` against `entry` (see `verify_image`).

  Never raises for a bad file: an unreadable, truncated or foreign file gives a "refused" verdict
  whose message names the file and the failed check. An "unrecognized-build" verdict also issues
  an UnrecognizedCodeObjectWarning naming the file and its sha256, once per cached verdict.
  Verdicts are cached per (path, size, mtime, entry): an unchanged file is not rehashed.
  """
  path = Path(path)
  try:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, entry)
  except OSError as e:
    return _unreadable(path, entry, e)
  with _lock:
    cached = _verdicts.get(key)
  if cached is not None:
    return cached
  try:
    image = path.read_bytes()
  except OSError as e:
    return _unreadable(path, entry, e)
  verdict = verify_image(image, path, entry)
  if verdict.status == "unrecognized-build":
    warnings.warn(verdict.message, UnrecognizedCodeObjectWarning, stacklevel=2)
  with _lock:
    _verdicts[key] = verdict
  return verdict


def _unreadable(path: Path, entry: manifest_lib.KernelEntry, error: OSError) -> Verdict:
  return Verdict(status="refused", path=str(path), kernel_id=entry.id, check="readable",
                 message=(f"{path}: refused as the {entry.id} code object: check 'readable' "
                          f"failed: {error.strerror or error}"))


def _aiter_roots() -> list[tuple[Path, str]]:
  """Candidate roots of aiter's tree (the directory holding its hsa/), each with how it was found.

  Only import *specs* and distribution metadata are consulted: `find_spec` of a top-level name
  runs no module code, so aiter (and torch, which it imports) are never imported.
  """
  roots: list[tuple[Path, str]] = []

  def package_dirs(name: str) -> list[Path]:
    try:
      spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # ValueError: a module in sys.modules without a spec.
      return []
    if spec is None:
      return []
    if spec.submodule_search_locations:
      return [Path(p) for p in spec.submodule_search_locations]
    return [Path(spec.origin).parent] if spec.origin else []

  for package in package_dirs(_AITER_PACKAGE):
    roots.append((package.parent, f"checkout next to the aiter package {package}"))
    roots.append((package.parent / _AITER_META_PACKAGE,
                  f"aiter_meta installed next to the aiter package {package}"))
  for meta in package_dirs(_AITER_META_PACKAGE):
    roots.append((meta, "the aiter_meta package"))
  for name in _AITER_DISTRIBUTIONS:
    try:
      distribution = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
      continue
    site = Path(distribution.locate_file(""))
    roots.append((site / _AITER_META_PACKAGE, f"the {name} distribution's files"))
  # A shadowed aiter (several on sys.path) is still found, after the one Python would import.
  for entry in sys.path:
    site = Path(entry or ".")
    if (site / _AITER_PACKAGE).is_dir():
      roots.append((site, f"an aiter directory on sys.path in {site}"))
      roots.append((site / _AITER_META_PACKAGE, f"aiter_meta on sys.path in {site}"))

  unique: list[tuple[Path, str]] = []
  seen: set[Path] = set()
  for root, how in roots:
    resolved = root.resolve()
    if resolved not in seen:
      seen.add(resolved)
      unique.append((resolved, how))
  return unique


def _search_steps(entry: manifest_lib.KernelEntry) -> Iterator[tuple[Source, Path | None, str]]:
  """Yields (source, directory or None, description) for each place to look, in search order.

  Lazy, so a hit in an early location skips the scan for aiter.
  """
  set_dir = _code_object_dir
  yield ("set_code_object_dir", set_dir, "not set" if set_dir is None else str(set_dir))
  env_value = os.environ.get(ENV_VAR, "")
  env_dir = Path(env_value).expanduser() if env_value else None
  yield (ENV_VAR, env_dir, "not set" if env_dir is None else str(env_dir))
  roots = _aiter_roots()
  if not roots:
    yield ("aiter", None, "no aiter package or aiter_meta found on sys.path "
           f"(find_spec('aiter'), find_spec('aiter_meta'), distributions "
           f"{list(_AITER_DISTRIBUTIONS)})")
  for root, how in roots:
    yield ("aiter", root / entry.aiter_subdir, how)


def find_code_object(kernel_id: str) -> FoundCodeObject:
  """Finds and verifies the code object of a manifest kernel, in the documented search order.

  Returns the first file found that verifies ("verified" or "unrecognized-build"). Raises
  CodeObjectError listing every place searched when no location has the file, or carrying the
  verdict when the first file found is refused (the search does not go on past a refused file).
  Raises KeyError for an id that is not in the manifest.
  """
  entry = manifest_lib.kernel(kernel_id)
  searched: list[str] = []
  for source, directory, how in _search_steps(entry):
    if directory is None:
      searched.append(f"{source}: {how}")
      continue
    candidate = directory / entry.file
    label = f"{source}: {candidate}" + ("" if how == str(directory) else f" ({how})")
    if not candidate.exists():
      searched.append(f"{label}: no such file")
      continue
    verdict = verify_code_object(candidate, entry)
    searched.append(f"{label}: {verdict.status}")
    if not verdict.usable:
      raise CodeObjectError(
          f"The {kernel_id} code object found by {source} was refused, so the search stopped "
          f"there:\n  {verdict.message}\nReplace that file with AMD's build from aiter "
          f"({entry.aiter_subdir}/{entry.file}), or point jax_mla.set_code_object_dir(...) or "
          f"{ENV_VAR} at a directory holding a good copy. Searched:\n"
          + "\n".join(f"  - {s}" for s in searched),
          kernel_id=kernel_id, searched=tuple(searched), verdict=verdict)
    return FoundCodeObject(kernel_id=kernel_id, path=candidate, source=source, verdict=verdict)
  raise CodeObjectError(
      f"No code object for {kernel_id} ({entry.file}, symbol {entry.symbol}) was found. jax_mla "
      f"does not ship AMD's code objects: install aiter, or point "
      f"jax_mla.set_code_object_dir(...) or {ENV_VAR} at the directory holding {entry.file} (in "
      f"aiter's tree: {entry.aiter_subdir}). Searched:\n"
      + "\n".join(f"  - {s}" for s in searched),
      kernel_id=kernel_id, searched=tuple(searched))


def discover_all() -> list[Discovery]:
  """The search result for every kernel of the manifest, in manifest order; never raises for a
  missing or refused file (that is reported in the Discovery)."""
  results = []
  for entry in manifest_lib.load_manifest().kernels:
    try:
      found = find_code_object(entry.id)
    except CodeObjectError as e:
      verdict = e.verdict
      results.append(Discovery(
          kernel_id=entry.id, file=entry.file,
          status="missing" if verdict is None else verdict.status,
          path=None if verdict is None else verdict.path, source=None, message=str(e)))
      continue
    results.append(Discovery(kernel_id=entry.id, file=entry.file, status=found.verdict.status,
                             path=str(found.path), source=found.source,
                             message=found.verdict.message))
  return results


def load_verified_image(kernel_id: str) -> bytes:
  """The bytes of the kernel's code object, found and verified as by `find_code_object`.

  The returned bytes are the ones verified: if the file changed since its verdict was cached,
  the new bytes are verified again. Raises CodeObjectError when no usable file exists or the
  file cannot be read or no longer verifies.
  """
  found = find_code_object(kernel_id)
  try:
    image = found.path.read_bytes()
  except OSError as e:
    raise CodeObjectError(f"{found.path}: cannot read the verified {kernel_id} code object: {e}",
                          kernel_id=kernel_id, searched=(str(found.path),)) from e
  if hashlib.sha256(image).hexdigest() == found.verdict.sha256:
    return image
  verdict = verify_image(image, found.path, manifest_lib.kernel(kernel_id))
  if not verdict.usable:
    raise CodeObjectError(f"{found.path} changed after it was verified and is now refused:\n  "
                          f"{verdict.message}", kernel_id=kernel_id,
                          searched=(str(found.path),), verdict=verdict)
  if verdict.status == "unrecognized-build":
    warnings.warn(verdict.message, UnrecognizedCodeObjectWarning, stacklevel=2)
  return image
