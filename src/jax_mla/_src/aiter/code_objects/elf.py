"""A small, self-contained reader for AMDGPU code objects (ELF64 + the NT_AMDGPU_METADATA note).

It reads only what verifying a code object needs: the ELF header (machine, e_flags), the symbol
names of .symtab/.dynsym, and the msgpack metadata note with its per-kernel fields. It uses
`struct` and `msgpack` only, so it adds no runtime dependency.

Every bounds problem raises `ElfFormatError` naming the structure that did not fit, so a truncated
or corrupt file never surfaces as an IndexError or struct.error.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator, Mapping
from typing import Any

import msgpack

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
EM_AMDGPU = 224
ELFOSABI_AMDGPU_HSA = 64

# e_flags & EF_AMDGPU_MACH is the processor; the feature bits (xnack, sramecc) sit above it.
EF_AMDGPU_MACH = 0xFF
MACH_BY_NAME: Mapping[str, int] = {
    "gfx900": 0x2C,
    "gfx906": 0x2F,
    "gfx908": 0x30,
    "gfx90a": 0x3F,
    "gfx940": 0x40,
    "gfx942": 0x4C,
    "gfx950": 0x4F,
}
NAME_BY_MACH: Mapping[int, str] = {mach: name for name, mach in MACH_BY_NAME.items()}

SHT_SYMTAB = 2
SHT_NOTE = 7
SHT_DYNSYM = 11
NT_AMDGPU_METADATA = 32
NOTE_NAME_AMDGPU = b"AMDGPU"

_EHDR = struct.Struct("<HHIQQQIHHHHHH")  # e_type .. e_shstrndx, after the 16-byte e_ident
_EHDR_SIZE = 16 + _EHDR.size  # 64
_SHDR = struct.Struct("<IIQQQQIIQQ")  # 64 bytes
_SYM = struct.Struct("<IBBHQQ")  # 24 bytes
_NHDR = struct.Struct("<III")  # namesz, descsz, type


class ElfFormatError(ValueError):
  """The bytes are not a readable AMDGPU ELF64 code object.

  `check` names the structure or property that failed (e.g. "elf-magic", "section-headers"),
  so callers can report which check refused the file.
  """

  def __init__(self, check: str, message: str):
    super().__init__(message)
    self.check = check


@dataclasses.dataclass(frozen=True)
class ElfHeader:
  """The fields of the ELF header that identify a code object."""
  ei_class: int
  ei_data: int
  os_abi: int
  abi_version: int
  e_type: int
  e_machine: int
  e_flags: int
  e_shoff: int
  e_shentsize: int
  e_shnum: int

  @property
  def mach(self) -> int:
    """The processor id, `e_flags & 0xff` (0x4f is gfx950)."""
    return self.e_flags & EF_AMDGPU_MACH

  @property
  def arch(self) -> str | None:
    """The gfx name of `mach`, or None when this reader does not know it."""
    return NAME_BY_MACH.get(self.mach)


@dataclasses.dataclass(frozen=True)
class KernelMetadata:
  """One entry of the note's `amdhsa.kernels`, as decoded: None when absent, types unchecked."""
  name: Any
  symbol: Any
  kernarg_segment_size: Any
  group_segment_fixed_size: Any
  wavefront_size: Any
  reqd_workgroup_size: Any
  raw: Mapping[str, Any]

  def names(self, function_symbol: str) -> bool:
    """Whether this entry describes `function_symbol`: `.symbol` is "<name>.kd" or `.name` is it."""
    return self.symbol == function_symbol + ".kd" or self.name == function_symbol


@dataclasses.dataclass(frozen=True)
class _Section:
  sh_type: int
  sh_offset: int
  sh_size: int
  sh_link: int


def _unpack(layout: struct.Struct, image: bytes, offset: int, what: str, check: str) -> tuple:
  if offset < 0 or offset + layout.size > len(image):
    raise ElfFormatError(
        check, f"truncated: {what} needs bytes {offset}..{offset + layout.size} but the file has "
        f"{len(image)} bytes")
  return layout.unpack_from(image, offset)


def read_header(image: bytes) -> ElfHeader:
  """Decodes the ELF header. Raises ElfFormatError (check "elf-magic", "elf-class" or
  "elf-header") unless `image` starts with a complete little-endian ELF64 header."""
  if len(image) == 0:
    raise ElfFormatError("elf-magic", "not an ELF file: the file is empty (0 bytes)")
  if image[:4] != ELF_MAGIC:
    raise ElfFormatError(
        "elf-magic", f"not an ELF file: starts with {bytes(image[:4])!r}, expected {ELF_MAGIC!r}")
  if len(image) < 6:
    raise ElfFormatError("elf-header", f"truncated: the ELF header is 64 bytes, the file has "
                         f"{len(image)}")
  if image[4] != ELFCLASS64:
    raise ElfFormatError("elf-class", f"expected ELFCLASS64 (2), found EI_CLASS {image[4]}")
  if image[5] != ELFDATA2LSB:
    raise ElfFormatError("elf-class",
                         f"expected little-endian ELFDATA2LSB (1), found EI_DATA {image[5]}")
  if len(image) < _EHDR_SIZE:
    raise ElfFormatError("elf-header", f"truncated: the ELF header is {_EHDR_SIZE} bytes, the "
                         f"file has {len(image)}")
  (e_type, e_machine, _version, _entry, _phoff, e_shoff, e_flags, _ehsize, _phentsize, _phnum,
   e_shentsize, e_shnum, _shstrndx) = _EHDR.unpack_from(image, 16)
  return ElfHeader(ei_class=image[4], ei_data=image[5], os_abi=image[7], abi_version=image[8],
                   e_type=e_type, e_machine=e_machine, e_flags=e_flags, e_shoff=e_shoff,
                   e_shentsize=e_shentsize, e_shnum=e_shnum)


def _sections(image: bytes, header: ElfHeader) -> list[_Section]:
  if header.e_shnum == 0:
    raise ElfFormatError("section-headers", "the file has no section headers")
  if header.e_shentsize != _SHDR.size:
    raise ElfFormatError("section-headers", f"section header entries are {header.e_shentsize} "
                         f"bytes, expected {_SHDR.size}")
  sections = []
  for i in range(header.e_shnum):
    (_name, sh_type, _flags, _addr, sh_offset, sh_size, sh_link, _info, _align,
     _entsize) = _unpack(_SHDR, image, header.e_shoff + i * _SHDR.size,
                         f"section header {i} of {header.e_shnum}", "section-headers")
    sections.append(_Section(sh_type, sh_offset, sh_size, sh_link))
  return sections


def _section_bytes(image: bytes, section: _Section, what: str, check: str) -> bytes:
  end = section.sh_offset + section.sh_size
  if end > len(image):
    raise ElfFormatError(check, f"truncated: {what} needs bytes {section.sh_offset}..{end} but "
                         f"the file has {len(image)} bytes")
  return image[section.sh_offset:end]


def _align4(n: int) -> int:
  return (n + 3) & ~3


def _notes(data: bytes) -> Iterator[tuple[bytes, int, bytes]]:
  """Yields (name, type, desc) of each note record in a SHT_NOTE section's bytes."""
  offset = 0
  while offset < len(data):
    namesz, descsz, note_type = _unpack(_NHDR, data, offset, "a note header", "metadata-note")
    name_at = offset + _NHDR.size
    desc_at = name_at + _align4(namesz)
    end = desc_at + _align4(descsz)
    if desc_at + descsz > len(data):
      raise ElfFormatError("metadata-note", f"truncated: a note record claims {namesz} name and "
                           f"{descsz} descriptor bytes beyond the end of its section")
    yield data[name_at:name_at + namesz].rstrip(b"\0"), note_type, data[desc_at:desc_at + descsz]
    offset = end


def read_metadata(image: bytes, header: ElfHeader) -> dict[str, Any] | None:
  """The decoded NT_AMDGPU_METADATA note (a msgpack map such as {"amdhsa.kernels": [...]}), or
  None when the file has no such note. Raises ElfFormatError for malformed notes or msgpack."""
  for section in _sections(image, header):
    if section.sh_type != SHT_NOTE:
      continue
    data = _section_bytes(image, section, "a note section", "metadata-note")
    for name, note_type, desc in _notes(data):
      if name != NOTE_NAME_AMDGPU or note_type != NT_AMDGPU_METADATA:
        continue
      try:
        decoded = msgpack.unpackb(desc, raw=False, strict_map_key=False)
      except Exception as e:  # msgpack raises several unrelated types for bad input.
        raise ElfFormatError("metadata-note", f"the AMDGPU metadata note is not valid msgpack "
                             f"({type(e).__name__}: {e})") from e
      if not isinstance(decoded, dict):
        raise ElfFormatError("metadata-note", f"the AMDGPU metadata note decodes to a "
                             f"{type(decoded).__name__}, expected a map")
      return decoded
  return None


def kernels_in(metadata: Mapping[str, Any]) -> list[KernelMetadata]:
  """The entries of `amdhsa.kernels` in decoded metadata. Raises ElfFormatError if it is not a
  list of maps."""
  kernels = metadata.get("amdhsa.kernels", [])
  if not isinstance(kernels, list) or not all(isinstance(k, dict) for k in kernels):
    raise ElfFormatError("metadata-note", "the metadata's amdhsa.kernels is not a list of maps")
  return [
      KernelMetadata(name=k.get(".name"), symbol=k.get(".symbol"),
                     kernarg_segment_size=k.get(".kernarg_segment_size"),
                     group_segment_fixed_size=k.get(".group_segment_fixed_size"),
                     wavefront_size=k.get(".wavefront_size"),
                     reqd_workgroup_size=k.get(".reqd_workgroup_size"), raw=k) for k in kernels
  ]


def read_symbol_names(image: bytes, header: ElfHeader) -> frozenset[str]:
  """The names of every symbol in .symtab and .dynsym. Raises ElfFormatError when a symbol table
  or its string table does not fit in the file."""
  sections = _sections(image, header)
  names: set[str] = set()
  for section in sections:
    if section.sh_type not in (SHT_SYMTAB, SHT_DYNSYM):
      continue
    if not 0 <= section.sh_link < len(sections):
      raise ElfFormatError("symbol-table", f"a symbol table links to string table "
                           f"{section.sh_link}, but there are {len(sections)} sections")
    table = _section_bytes(image, section, "a symbol table", "symbol-table")
    strings = _section_bytes(image, sections[section.sh_link], "a symbol string table",
                             "symbol-table")
    for offset in range(0, len(table) - _SYM.size + 1, _SYM.size):
      st_name = _SYM.unpack_from(table, offset)[0]
      if st_name >= len(strings) and st_name != 0:
        raise ElfFormatError("symbol-table", f"a symbol name offset {st_name} is past its string "
                             f"table ({len(strings)} bytes)")
      end = strings.find(b"\0", st_name)
      raw = strings[st_name:end if end >= 0 else len(strings)]
      if raw:
        names.add(raw.decode("utf-8", errors="replace"))
  return frozenset(names)
