"""ptxas on a Mosaic kernel's PTX, on any x86-64 machine: registers, spills, the C75xx notes,
whether each `setmaxnreg` survived into the SASS, and where the spills are (the SASS's LDL / STL
per warpgroup role, split at its USETMAXREG instructions, as benchmarks/ncu_roles.py does).

The PTX comes from any machine with jax's CUDA plugin, no GPU needed (Mosaic GPU compiles the
kernel inside XLA's deviceless compile for an sm90 target):
  python benchmarks/xla_kernels.py --shapes "[[128, 1, 128, 2048]]" --mosaic-dump DIR
or from a GPU machine:
  MOSAIC_GPU_DUMP_TO=DIR python benchmarks/ncu_decode.py 128 1 128 2048
ptxas and nvdisasm come from PyPI, no GPU or CUDA install needed:
  pip install nvidia-cuda-nvcc nvidia-cuda-nvdisasm
Usage:
  python tools/ptxas_report.py FILE.ptx[.gz] [--maxntid 384] [--setmaxnreg LINE=COUNT ...]
`--maxntid` and `--setmaxnreg` rewrite the PTX before compiling it: what the kernel would
compile to with another launch size or register split, without a GPU (benchmarks/README.md,
the two-producer kernel: ptxas checks every instruction against the launch's register count).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from ncu_roles import split_at_setmaxnreg  # noqa: E402  pylint: disable=wrong-import-position

_MAXNTID = re.compile(r"^\.maxntid\s+(\d+)", re.M)
_SETMAXNREG = re.compile(r"(setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+)(\d+);")
_USED = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_NOTE = re.compile(r"\((C\d{4})\) (.*)")
_SPILL_INSTRUCTION = re.compile(r"\b(LDL|STL)(\.\S+)? ")


@dataclasses.dataclass
class Report:
  """What one ptxas run said: registers is None where it failed (fatal holds why)."""
  registers: int | None = None
  spill_stores: int = 0
  spill_loads: int = 0
  notes: tuple[str, ...] = ()
  fatal: tuple[str, ...] = ()


def parse_ptxas(text):
  """A Report from ptxas -v's output."""
  used = _USED.search(text)
  spills = _SPILLS.search(text)
  notes, fatal = [], []
  for line in text.splitlines():
    note = _NOTE.search(line)
    if "fatal" in line and "aborted due to errors" not in line:
      fatal.append(line.split(":", 1)[-1].strip())
    elif note:
      notes.append(f"{note.group(1)} {note.group(2).strip()}")
  return Report(registers=int(used.group(1)) if used else None,
                spill_stores=int(spills.group(1)) if spills else 0,
                spill_loads=int(spills.group(2)) if spills else 0,
                notes=tuple(notes), fatal=tuple(fatal))


def setmaxnreg_sites(ptx):
  """[(line number, "inc" or "dec", count)] of the PTX's setmaxnreg instructions."""
  return [(number, m.group(2), int(m.group(3)))
          for number, line in enumerate(ptx.splitlines(), 1)
          for m in [_SETMAXNREG.search(line)] if m]


def with_maxntid(ptx, threads):
  """The PTX with its entry's .maxntid set to `threads` (one entry, one directive)."""
  if len(_MAXNTID.findall(ptx)) != 1:
    raise ValueError("expected exactly one .maxntid directive")
  return _MAXNTID.sub(f".maxntid {threads}", ptx)


def with_setmaxnreg(ptx, line, count):
  """The PTX with the setmaxnreg on `line` (1-based) set to `count`."""
  lines = ptx.splitlines(keepends=True)
  if not 1 <= line <= len(lines) or not _SETMAXNREG.search(lines[line - 1]):
    raise ValueError(f"no setmaxnreg on line {line}")
  lines[line - 1] = _SETMAXNREG.sub(lambda m: f"{m.group(1)}{count};", lines[line - 1])
  return "".join(lines)


def _tool(name):
  """A CUDA tool from PATH or from the nvidia-cuda-* wheels' bin folder."""
  found = shutil.which(name)
  if found:
    return found
  try:
    import nvidia  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  for root in nvidia.__path__:
    for sub in ("cu13", "cuda_nvcc", "cuda_nvdisasm"):
      path = os.path.join(root, sub, "bin", name)
      if os.path.exists(path):
        return path
  return None


def spills_by_region(sass):
  """[(region, LDL/STL instructions in it)] of a SASS listing split at its USETMAXREG
  instructions: "entry" before the first, then each region by the count it sets."""
  return [("entry" if count is None else count,
           sum(1 for line in lines if _SPILL_INSTRUCTION.search(line)))
          for count, lines in split_at_setmaxnreg(sass.splitlines())]


def compile_ptx(ptx, arch="sm_90a"):
  """(Report, spills_by_region of the SASS, or None without nvdisasm or a cubin)."""
  ptxas = _tool("ptxas")
  if ptxas is None:
    raise SystemExit("no ptxas: pip install nvidia-cuda-nvcc (or put CUDA's bin on PATH)")
  with tempfile.TemporaryDirectory() as tmp:
    src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
    with open(src, "w") as f:
      f.write(ptx)
    run = subprocess.run([ptxas, f"-arch={arch}", "-v", src, "-o", cubin],
                         capture_output=True, text=True, check=False)
    report = parse_ptxas(run.stdout + run.stderr)
    nvdisasm = _tool("nvdisasm")
    if nvdisasm is None or not os.path.exists(cubin):
      return report, None
    sass = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True,
                          check=True).stdout
    return report, spills_by_region(sass)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
  parser.add_argument("ptx")
  parser.add_argument("--arch", default="sm_90a")
  parser.add_argument("--maxntid", type=int)
  parser.add_argument("--setmaxnreg", action="append", default=[], metavar="LINE=COUNT")
  args = parser.parse_args(argv)
  with (gzip.open if args.ptx.endswith(".gz") else open)(args.ptx, "rt") as f:
    ptx = f.read()
  if args.maxntid:
    ptx = with_maxntid(ptx, args.maxntid)
  for change in args.setmaxnreg:
    line, count = map(int, change.split("="))
    ptx = with_setmaxnreg(ptx, line, count)
  print(f".maxntid {_MAXNTID.search(ptx).group(1)}; setmaxnreg: " + ", ".join(
      f"line {n} {action} {count}" for n, action, count in setmaxnreg_sites(ptx)))
  report, regions = compile_ptx(ptx, args.arch)
  for line in report.fatal:
    print("fatal:", line)
  if report.registers is not None:
    print(f"{report.registers} registers, spills {report.spill_stores} B stored / "
          f"{report.spill_loads} B loaded")
  for note in report.notes:
    print("note:", note)
  if regions is not None:
    print(f"USETMAXREG in the SASS: {len(regions) - 1} of {len(setmaxnreg_sites(ptx))} "
          "setmaxnreg; LDL/STL by region: " + ", ".join(
              f"{name if name == 'entry' else f'setmaxnreg {name}'} {count}"
              for name, count in regions))
  return 1 if report.fatal else 0


if __name__ == "__main__":
  sys.exit(main())
