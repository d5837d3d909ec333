"""The manifest of known kernels (hsa/manifest.json) as typed, validated data.

The schema is documented in hsa/README.md. Every field is checked on load; a bad manifest raises
`ManifestError` naming the entry and the field, so a typo fails the first test that loads it
rather than a launch on hardware.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from jax_mla._src.aiter.code_objects import elf as amdgpu_elf

SCHEMA_VERSION = 1
FAMILIES = ("split", "persistent")

_PACKAGE_DIR = Path(__file__).resolve().parents[3]  # jax_mla/
# Installed wheels carry the manifest inside the package (CMakeLists installs it to jax_mla/hsa);
# a source checkout keeps it at <repo>/hsa, the package being <repo>/src/jax_mla.
MANIFEST_CANDIDATES = (
    _PACKAGE_DIR / "hsa" / "manifest.json",
    _PACKAGE_DIR.parent.parent / "hsa" / "manifest.json",
)

_TOP_LEVEL_FIELDS = frozenset({"schema", "kernels"})
_KERNEL_FIELDS = frozenset({
    "id", "file", "symbol", "arch", "kernarg_size", "block", "wavefront", "family", "serves",
    "known_sha256", "aiter_subdir"
})
_KNOWN_BUILD_FIELDS = frozenset({"sha256", "note"})
_ID_PATTERN = re.compile(r"[a-z][a-z0-9_]*")
_SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")


class ManifestError(ValueError):
  """The manifest file is missing, not JSON, or violates the schema (the message says where)."""


@dataclasses.dataclass(frozen=True)
class KnownBuild:
  """A build of a code object whose bytes were seen before: its sha256 and which build it is."""
  sha256: str
  note: str


@dataclasses.dataclass(frozen=True)
class KernelEntry:
  """One kernel of the manifest: where its code object is, and the ABI the file must declare."""
  id: str
  file: str
  symbol: str
  arch: str
  kernarg_size: int
  block: tuple[int, int, int]
  wavefront: int
  family: str
  serves: tuple[tuple[int, int], ...]
  known_sha256: tuple[KnownBuild, ...]
  aiter_subdir: str

  @property
  def known_hashes(self) -> frozenset[str]:
    return frozenset(build.sha256 for build in self.known_sha256)

  def known_build(self, sha256: str) -> KnownBuild | None:
    """The known build with this hash, or None."""
    for build in self.known_sha256:
      if build.sha256 == sha256:
        return build
    return None


@dataclasses.dataclass(frozen=True)
class Manifest:
  """The parsed manifest: its schema version, its kernels in file order, and where it came from."""
  schema: int
  kernels: tuple[KernelEntry, ...]
  source: str

  @property
  def ids(self) -> tuple[str, ...]:
    return tuple(k.id for k in self.kernels)

  def kernel(self, kernel_id: str) -> KernelEntry:
    """The entry with this id; raises KeyError listing the known ids."""
    for entry in self.kernels:
      if entry.id == kernel_id:
        return entry
    raise KeyError(f"No kernel {kernel_id!r} in the manifest {self.source}; known ids: "
                   f"{', '.join(self.ids)}")


def _fail(where: str, message: str) -> ManifestError:
  return ManifestError(f"{where}: {message}")


def _expect_fields(obj: Any, fields: frozenset[str], where: str) -> Mapping[str, Any]:
  if not isinstance(obj, dict):
    raise _fail(where, f"expected a JSON object, found {type(obj).__name__}")
  missing = sorted(fields - obj.keys())
  unknown = sorted(obj.keys() - fields)
  if missing:
    raise _fail(where, f"missing field(s) {missing}")
  if unknown:
    raise _fail(where, f"unknown field(s) {unknown}; the schema has {sorted(fields)}")
  return obj


def _string(obj: Mapping[str, Any], field: str, where: str) -> str:
  value = obj[field]
  if not isinstance(value, str) or not value:
    raise _fail(where, f"{field!r} must be a non-empty string, found {value!r}")
  return value


def _positive_int(value: Any, what: str, where: str) -> int:
  # bool is an int subclass: reject it explicitly so `true` is not read as 1.
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise _fail(where, f"{what} must be a positive integer, found {value!r}")
  return value


def _int_list(value: Any, length: int | None, what: str, where: str) -> tuple[int, ...]:
  if not isinstance(value, list) or (length is not None and len(value) != length):
    shape = f"a list of {length}" if length is not None else "a list of"
    raise _fail(where, f"{what} must be {shape} positive integers, found {value!r}")
  return tuple(_positive_int(v, what, where) for v in value)


def _parse_known_build(obj: Any, where: str) -> KnownBuild:
  obj = _expect_fields(obj, _KNOWN_BUILD_FIELDS, where)
  sha256 = _string(obj, "sha256", where)
  if not _SHA256_PATTERN.fullmatch(sha256):
    raise _fail(where, f"'sha256' must be 64 lowercase hex digits, found {sha256!r}")
  return KnownBuild(sha256=sha256, note=_string(obj, "note", where))


def _parse_kernel(obj: Any, where: str) -> KernelEntry:
  obj = _expect_fields(obj, _KERNEL_FIELDS, where)
  kernel_id = _string(obj, "id", where)
  if not _ID_PATTERN.fullmatch(kernel_id):
    raise _fail(where, f"'id' must match {_ID_PATTERN.pattern}, found {kernel_id!r}")
  where = f"{where} (id {kernel_id!r})"

  file = _string(obj, "file", where)
  if "/" in file or "\\" in file or not file.endswith(".co"):
    raise _fail(where, f"'file' must be a bare file name ending in .co, found {file!r}")
  arch = _string(obj, "arch", where)
  if arch not in amdgpu_elf.MACH_BY_NAME:
    raise _fail(where, f"'arch' {arch!r} is not one this reader knows: "
                f"{sorted(amdgpu_elf.MACH_BY_NAME)}")
  family = _string(obj, "family", where)
  if family not in FAMILIES:
    raise _fail(where, f"'family' must be one of {list(FAMILIES)}, found {family!r}")
  wavefront = _positive_int(obj["wavefront"], "'wavefront'", where)
  if wavefront not in (32, 64):
    raise _fail(where, f"'wavefront' must be 32 or 64, found {wavefront}")

  serves_raw = obj["serves"]
  if not isinstance(serves_raw, list) or not serves_raw:
    raise _fail(where, f"'serves' must be a non-empty list of [gqa, tokens_per_seq] pairs, "
                f"found {serves_raw!r}")
  serves = tuple(_int_list(pair, 2, "each 'serves' pair", where) for pair in serves_raw)
  if len(set(serves)) != len(serves):
    raise _fail(where, f"'serves' lists a pair twice: {serves_raw!r}")

  known_raw = obj["known_sha256"]
  if not isinstance(known_raw, list):
    raise _fail(where, f"'known_sha256' must be a list, found {known_raw!r}")
  known = tuple(
      _parse_known_build(b, f"{where} known_sha256[{i}]") for i, b in enumerate(known_raw))
  if len({b.sha256 for b in known}) != len(known):
    raise _fail(where, "'known_sha256' lists a hash twice")

  aiter_subdir = _string(obj, "aiter_subdir", where)
  subdir = PurePosixPath(aiter_subdir)
  if subdir.is_absolute() or ".." in subdir.parts or "\\" in aiter_subdir:
    raise _fail(where, f"'aiter_subdir' must be a relative POSIX path inside aiter's tree, "
                f"found {aiter_subdir!r}")

  return KernelEntry(
      id=kernel_id, file=file, symbol=_string(obj, "symbol", where), arch=arch,
      kernarg_size=_positive_int(obj["kernarg_size"], "'kernarg_size'", where),
      block=_int_list(obj["block"], 3, "'block'", where),  # type: ignore[arg-type]
      wavefront=wavefront, family=family, serves=serves,  # type: ignore[arg-type]
      known_sha256=known, aiter_subdir=aiter_subdir)


def parse_manifest(data: Any, source: str) -> Manifest:
  """Validates decoded manifest JSON and returns it typed. Raises ManifestError naming `source`,
  the entry and the field for any violation of schema 1 (see hsa/README.md)."""
  data = _expect_fields(data, _TOP_LEVEL_FIELDS, source)
  schema = data["schema"]
  if schema != SCHEMA_VERSION or isinstance(schema, bool):
    raise _fail(source, f"'schema' is {schema!r}; this jax_mla reads schema {SCHEMA_VERSION}")
  if not isinstance(data["kernels"], list):
    raise _fail(source, f"'kernels' must be a list, found {type(data['kernels']).__name__}")
  kernels = tuple(
      _parse_kernel(k, f"{source} kernels[{i}]") for i, k in enumerate(data["kernels"]))
  for field in ("id", "file", "symbol"):
    values = [getattr(k, field) for k in kernels]
    duplicates = sorted({v for v in values if values.count(v) > 1})
    if duplicates:
      raise _fail(source, f"kernel {field}s must be unique; repeated: {duplicates}")
  return Manifest(schema=schema, kernels=kernels, source=source)


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
  keys = [k for k, _ in pairs]
  duplicates = sorted({k for k in keys if keys.count(k) > 1})
  if duplicates:
    raise ManifestError(f"a JSON object repeats the key(s) {duplicates}")
  return dict(pairs)


def manifest_path() -> Path:
  """The manifest file: the installed package's jax_mla/hsa/manifest.json, else the source
  checkout's <repo>/hsa/manifest.json. Raises ManifestError listing both when neither exists."""
  for candidate in MANIFEST_CANDIDATES:
    if candidate.is_file():
      return candidate
  raise ManifestError("jax_mla's kernel manifest is missing; looked for "
                      + " and ".join(str(c) for c in MANIFEST_CANDIDATES))


def load_manifest(path: str | os.PathLike[str] | None = None) -> Manifest:
  """Loads and validates a manifest; with no `path`, jax_mla's own (cached after the first call).

  Raises ManifestError when the file is missing, is not JSON (or repeats a key), or violates the
  schema.
  """
  if path is None:
    return _default_manifest()
  return _load(Path(path))


@functools.cache
def _default_manifest() -> Manifest:
  return _load(manifest_path())


def _load(path: Path) -> Manifest:
  try:
    text = path.read_text(encoding="utf-8")
  except OSError as e:
    raise ManifestError(f"cannot read the kernel manifest {path}: {e}") from e
  try:
    data = json.loads(text, object_pairs_hook=_reject_duplicate_keys)
  except ManifestError as e:
    raise ManifestError(f"{path}: {e}") from e
  except json.JSONDecodeError as e:
    raise ManifestError(f"{path} is not valid JSON: {e}") from e
  return parse_manifest(data, str(path))


def kernel(kernel_id: str) -> KernelEntry:
  """The entry of jax_mla's manifest with this id; raises KeyError listing the known ids."""
  return load_manifest().kernel(kernel_id)
