"""The kernels the timed loops run on an NVIDIA Hopper, read from XLA's compile for one, on a
machine without a GPU.

XLA compiles for a GPU it is given a description of (deviceless, ahead of time): the same
fusion decisions, so the same kernels, as on the device (checked against the H200's profile of
run 5, 2026-12-05: at 128 heads, B 8, K 512 both list the Mosaic kernel, one reduce and two
select fusions for the split merge, the indptr's multiply fusion and the index update's two).
The Mosaic GPU kernel is a custom call here (it is built at run time); a Triton kernel (the
split merge's `merge_kernel`) is compiled.

For each shape and variant (`mosaic_ab.py`'s `--variant`, e.g. the merge kernel from two
splits) it prints the kernels of one iteration of vs_flashmla.py's jax_mla loop, and those of
its index-update loop (what every time is net of). A change to the XLA work around the decode
(the merge's form, the split count, the timed loop itself) can be checked here before a GPU
is lent: how many kernels, of what shape.

The same compile builds the Mosaic kernel itself (Mosaic GPU's pipeline runs inside XLA's compile,
ptxas included where one is on PATH): `--mosaic-dump DIR` keeps, per shape and variant, its PTX,
ptxas's report (registers, spills) and its resources in DIR/<shape>_<variant>/ and prints its
registers, spills and ptxas's notes, so a kernel change's register cost is known before a GPU
is lent (`tools/ptxas_report.py` then splits the spills by warpgroup role).

Needs jax's CUDA plugin at jax's version, without its CUDA libraries (the compile needs none):
  pip install --no-deps jax-cuda13-plugin==VERSION jax-cuda13-pjrt==VERSION
and for --mosaic-dump's report a ptxas on PATH (CUDA's bin; checked with CUDA 13.0's).
Usage (from the repository root, any machine):
  PYTHONPATH=src:benchmarks JAX_PLATFORMS=cpu python benchmarks/xla_kernels.py \
      [--shapes "[[128, 1, 8, 512]]"] [--variant NAME:MODULE.ATTR=VALUE ...] [--mosaic-dump DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import glob
import json
import os
import re
import sys
from unittest import mock

DEFAULT_SHAPES = [[128, 1, 1, 512], [128, 1, 8, 512], [128, 1, 32, 512], [64, 1, 8, 1024],
                  [128, 1, 1, 2048]]
# The target: an sm90 GPU as XLA describes one (H100 SXM's figures; the H200 is the same chip
# with more, faster memory, which no fusion decision here depends on).
HOPPER = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: 4800000000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: 150000000000 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 } registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 10 }
runtime_version { major: 13 }
device_description_str: "NVIDIA H200"
"""
_COMPUTATION = re.compile(r"^(ENTRY )?(%[\w.\-]+) ")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?(%[\w.\-]+) = (.+?) (fusion|custom-call|while)\((.*)$")


def computations(hlo_text: str) -> dict:
  """{computation name: its instruction lines} of an HLO module's text ("ENTRY" for the
  entry)."""
  comps, name = {}, None
  for line in hlo_text.splitlines():
    head = _COMPUTATION.match(line)
    if head and line.rstrip().endswith("{"):
      name = "ENTRY" if head.group(1) else head.group(2)
      comps[name] = []
    elif name is not None and line.strip() not in ("", "}"):
      comps[name].append(line)
  return comps


def launches(lines) -> list:
  """[(name, what)] of the kernels among a computation's lines: its fusions (by their kind) and
  custom calls (by their target), in order."""
  found = []
  for line in lines:
    m = _INSTRUCTION.match(line)
    if not m or m.group(4) == "while":
      continue
    shape, op, rest = m.group(3), m.group(4), m.group(5)
    if op == "custom-call":
      target = re.search(r'custom_call_target="([^"]+)"', rest)
      what = f"custom-call {target.group(1) if target else '?'}"
    else:
      kind = re.search(r"kind=(\w+)", rest)
      what = f"fusion {kind.group(1) if kind else '?'}"
    found.append((m.group(2).lstrip("%"), f"{what} -> {shape}"))
  return found


def loop_body_launches(hlo_text: str) -> list:
  """The kernels of one iteration of the module's (single) while loop."""
  comps = computations(hlo_text)
  bodies = {b for lines in comps.values() for line in lines
            for b in re.findall(r"\bbody=(%[\w.\-]+)", line)}
  if len(bodies) != 1:
    raise ValueError(f"expected one while loop, found bodies {sorted(bodies)}")
  return launches(comps[bodies.pop()])


@contextlib.contextmanager
def hopper_target():
  """(sharding to compile with) for a deviceless sm90 target; the Pallas backend resolved to the
  Mosaic kernel and Triton lowerings aimed at an H200 meanwhile."""
  import jax  # pylint: disable=import-outside-toplevel
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  from jax_mla._src.pallas import backend  # pylint: disable=import-outside-toplevel
  topology = topologies.get_topology_desc(platform="cuda", target_config=HOPPER,
                                          topology="1x1x1")
  mesh = topologies.make_mesh(topology, (1,), ("d",))
  # The mesh's abstract device (device_kind from HOPPER) is what Triton lowerings ask for.
  with mock.patch.object(backend, "device_kernel",
                         lambda: ("mosaic", "a deviceless sm90 target")), \
       jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    yield jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def loop_texts(shape, sharding) -> dict:
  """{"jax_mla": ..., "index_update": ...}: the optimized HLO of vs_flashmla.py's two loops at
  `shape` (the pool an argument of the same type as the timed run's)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import jax_mla  # pylint: disable=import-outside-toplevel
  import vs_flashmla as vf  # pylint: disable=import-outside-toplevel

  tokens = shape[1]
  spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  pool = jax.eval_shape(jax_mla.pack_rows, jax.ShapeDtypeStruct((vf.POOL, 512), jnp.bfloat16))
  # The timed loops' own arguments (their types only), then the pool.
  args = [spec(x) for x in (*jax.eval_shape(functools.partial(vf.call_args, shape)), *pool)]

  def decode(q, q_rope, idx, sink, indptr, kv, kv_rope):
    return vf.decode_call(kv, kv_rope, tokens, "pallas")(q, q_rope, idx, sink, indptr)

  def update(q, q_rope, idx, sink, indptr, kv, kv_rope):
    del kv, kv_rope
    return vf.index_update(q, q_rope, idx, sink, indptr)

  return {name: vf.looped(f).lower(*args).compile().as_text()
          for name, f in (("jax_mla", decode), ("index_update", update))}


@contextlib.contextmanager
def mosaic_dump(directory):
  """Mosaic GPU writes what it compiles meanwhile into `directory` (created; None: nothing):
  it reads MOSAIC_GPU_DUMP_TO when it lowers a kernel, and prints to stdout where the folder
  does not exist. It writes every dump it has; the IR after each of its passes (about 100 MB
  a kernel) is deleted after."""
  if directory is None:
    yield
    return
  os.makedirs(directory, exist_ok=True)
  before = os.environ.get("MOSAIC_GPU_DUMP_TO")
  os.environ["MOSAIC_GPU_DUMP_TO"] = directory
  try:
    yield
  finally:
    for log in glob.glob(os.path.join(directory, "*.mlir-passes.log")):
      os.remove(log)
    if before is None:
      del os.environ["MOSAIC_GPU_DUMP_TO"]
    else:
      os.environ["MOSAIC_GPU_DUMP_TO"] = before


def ptxas_lines(directory) -> list:
  """A line per kernel dumped into `directory`: its registers, spills and ptxas's notes, as
  tools/ptxas_report.py reads a ptxas report."""
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
  from ptxas_report import parse_ptxas  # pylint: disable=import-outside-toplevel
  lines = []
  for path in sorted(glob.glob(os.path.join(directory, "*.ptxas"))):
    with open(path, encoding="utf-8") as f:
      report = parse_ptxas(f.read())
    lines.append(f"{os.path.basename(path)}: {report.registers} registers, spills "
                 f"{report.spill_stores} B stored / {report.spill_loads} B loaded" +
                 "".join(f"; {note}" for note in report.notes + report.fatal))
  return lines


def main(argv=None):
  import mosaic_ab  # pylint: disable=import-outside-toplevel
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--shapes", type=json.loads, default=DEFAULT_SHAPES)
  parser.add_argument("--variant", action="append", default=[], type=mosaic_ab.parse_variant)
  parser.add_argument("--mosaic-dump", metavar="DIR",
                      help="keep each shape's and variant's Mosaic kernel (PTX, ptxas's report, "
                           "resources) in DIR/<shape>_<variant>/")
  args = parser.parse_args(argv)
  results = []
  with hopper_target() as sharding:
    for shape in args.shapes:
      for name, overrides in [("default", [])] + args.variant:
        label = f"h{shape[0]}x{shape[1]}_b{shape[2]}_k{shape[3]}_{name}"
        dump = args.mosaic_dump and os.path.join(args.mosaic_dump, label)
        with mosaic_ab.overridden(overrides), mosaic_dump(dump):
          texts = loop_texts(shape, sharding)
        kernels = {loop: loop_body_launches(text) for loop, text in texts.items()}
        results.append(dict(shape=shape, variant=name, kernels=kernels))
        print(f"H{shape[0]}x{shape[1]} B{shape[2]} K{shape[3]} {name}: "
              f"{len(kernels['jax_mla'])} kernels per call "
              f"({len(kernels['index_update'])} of them the index update's)")
        for kernel, what in kernels["jax_mla"]:
          print(f"    {kernel:32s} {what}")
        if dump:
          # jax compiles a kernel it has compiled before only once: nothing new to dump then.
          for line in ptxas_lines(dump) or ["no Mosaic kernel compiled (the same as before)"]:
            print(f"    ptxas {line}")
  return results


if __name__ == "__main__":
  main()
