"""Builds small, real AMDGPU code objects for tests with LLVM's assembler and linker.

`kernel_source(KernelSpec(...))` writes assembler text for a kernel whose body is `s_endpgm` and
whose descriptor and metadata note declare what the spec says; `assemble(...)` turns it into a
code object with clang-22 and ld.lld-22 (the first LLVM that targets both gfx942 and gfx950).
Each field of the spec can be set wrong on purpose, so tests get one broken file per check.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

CLANG = "clang-22"
LLD = "ld.lld-22"


def missing_tools() -> list[str]:
  """The assembler tools not found on PATH (empty when code objects can be built)."""
  return [tool for tool in (CLANG, LLD) if shutil.which(tool) is None]


@dataclasses.dataclass(frozen=True)
class KernelSpec:
  """What the assembled code object declares.

  `symbol` is the kernel the file defines; `metadata_name` is the kernel its metadata note
  describes (by default the same). `reqd_workgroup_size=None` leaves the field out, and
  `with_metadata=False` leaves the whole NT_AMDGPU_METADATA note out.
  """
  symbol: str
  mcpu: str = "gfx950"
  code_object_version: int = 5
  kernarg_size: int = 336
  descriptor_kernarg_size: int = 336
  reqd_workgroup_size: tuple[int, int, int] | None = (256, 1, 1)
  wavefront_size: int = 64
  metadata_name: str | None = None
  with_metadata: bool = True


def kernel_source(spec: KernelSpec) -> str:
  """Assembler text for `spec`: an s_endpgm kernel, its descriptor, and a YAML metadata block."""
  name = spec.symbol
  meta_name = spec.metadata_name or spec.symbol
  lines = [
      f".amdhsa_code_object_version {spec.code_object_version}",
      ".text",
      f".globl {name}",
      ".p2align 8",
      f".type {name},@function",
      f"{name}:",
      "  s_endpgm",
      "",
      ".rodata",
      ".p2align 6",
      f".amdhsa_kernel {name}",
      "  .amdhsa_user_sgpr_kernarg_segment_ptr 1",
      f"  .amdhsa_kernarg_size {spec.descriptor_kernarg_size}",
      "  .amdhsa_next_free_vgpr 4",
      "  .amdhsa_next_free_sgpr 8",
      # gfx90a and later split the VGPR file into arch and accumulation registers.
      "  .amdhsa_accum_offset 4",
      ".end_amdhsa_kernel",
  ]
  if spec.with_metadata:
    lines += [
        "",
        ".amdgpu_metadata",
        "---",
        "amdhsa.version: [ 1, 2 ]",
        "amdhsa.kernels:",
        f"  - .name: {meta_name}",
        f"    .symbol: {meta_name}.kd",
        f"    .kernarg_segment_size: {spec.kernarg_size}",
        "    .kernarg_segment_align: 8",
        "    .group_segment_fixed_size: 0",
        "    .private_segment_fixed_size: 0",
        f"    .wavefront_size: {spec.wavefront_size}",
        "    .sgpr_count: 8",
        "    .vgpr_count: 4",
        "    .max_flat_workgroup_size: 256",
    ]
    if spec.reqd_workgroup_size is not None:
      x, y, z = spec.reqd_workgroup_size
      lines.append(f"    .reqd_workgroup_size: [ {x}, {y}, {z} ]")
    lines += ["...", ".end_amdgpu_metadata"]
  return "\n".join(lines) + "\n"


def assemble(spec: KernelSpec, out_dir: Path, stem: str) -> Path:
  """Assembles and links `spec` into `out_dir/<stem>.co`; raises RuntimeError with the tool's
  output if clang or lld fails."""
  source = out_dir / f"{stem}.s"
  obj = out_dir / f"{stem}.o"
  code_object = out_dir / f"{stem}.co"
  source.write_text(kernel_source(spec))
  commands = [
      [CLANG, "-x", "assembler", "-target", "amdgcn-amd-amdhsa", f"-mcpu={spec.mcpu}",
       f"-mcode-object-version={spec.code_object_version}", "-c", str(source), "-o", str(obj)],
      [LLD, "-shared", str(obj), "-o", str(code_object)],
  ]
  for command in commands:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
      raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr}")
  return code_object
