"""The nm_ps plan: all 336 kernarg bytes against an independent struct.pack encoding of
KERNELS.md section 4's table, the launch geometry, and the plan's refusals."""

import math
import struct

import numpy as np
import pytest

from jax_mla._src import ext

ADDRESS_KEYS = ("q", "q_rope", "kv", "kv_rope", "kv_indptr", "kv_indices", "sink", "out", "lse",
                "o_acc", "lse_acc", "desc", "cnt", "arange")


def addresses():
  # Distinct, recognisable values: 0x1000_0000_0000 * (i + 1) + i.
  return {k: (0x1000_0000_0000 * (i + 1)) + i for i, k in enumerate(ADDRESS_KEYS)}


def expected_kernargs(a, *, num_rows, num_partitions, return_lse=True, config=6 | (1 << 8)):
  """KERNELS.md section 4, one (offset, format, value) per table row; all else zero."""
  table = [
      (0x000, "<Q", a["o_acc"]),
      (0x008, "<Q", a["out"]),
      (0x010, "<Q", a["lse_acc"]),
      (0x018, "<Q", a["lse"] if return_lse else 0),
      (0x020, "<Q", a["q"]),
      (0x030, "<Q", a["kv"]),
      (0x040, "<Q", a["kv_indptr"]),
      (0x050, "<Q", a["kv_indices"]),
      (0x060, "<Q", a["desc"]),
      (0x068, "<Q", 0),
      (0x070, "<f", 1.0 / math.sqrt(512.0)),
      (0x080, "<I", 128),
      (0x090, "<I", 1),
      (0x098, "<Q", a["cnt"]),
      (0x0a0, "<I", num_partitions),
      (0x0a4, "<I", num_rows),
      (0x0b0, "<I", config),
      (0x0b8, "<Q", 0),
      (0x0c0, "<I", 0),
      (0x0d0, "<Q", a["arange"]),
      (0x0e0, "<Q", a["arange"]),
      (0x0f0, "<I", 1),
      (0x100, "<Q", a["q_rope"]),
      (0x110, "<Q", a["kv_rope"]),
      (0x120, "<Q", a["sink"]),
      (0x130, "<Q", 0),
      (0x140, "<I", 0),
  ]
  buf = bytearray(336)
  for offset, fmt, value in table:
    struct.pack_into(fmt, buf, offset, value)
  return bytes(buf)


@pytest.mark.parametrize("num_rows,num_partitions", [(1, 8), (64, 128), (32768, 1024), (0, 1)])
@pytest.mark.parametrize("return_lse", [True, False])
def test_golden_kernargs(num_rows, num_partitions, return_lse):
  a = addresses()
  plan = ext.extension().persistent_plan(a, num_rows, num_partitions, return_lse)
  want = expected_kernargs(a, num_rows=num_rows, num_partitions=num_partitions,
                           return_lse=return_lse)
  got = plan["kernargs"]
  assert len(got) == 336
  diff = [hex(i) for i in range(336) if got[i] != want[i]]
  assert not diff, f"kernarg bytes differ at offsets {diff[:16]}"
  assert plan["grid"] == (2 * num_partitions, 1, 1)
  assert plan["block"] == (256, 1, 1)
  assert plan["shared_mem_bytes"] == 0
  assert plan["kernel"] == "mla_v4_nm_ps"
  assert plan["symbol"] == "_ZN5aiter39mla_a8w8_qh64_qseqlen1_gqaratio64_nm_psE"


def test_scale_slot_is_float32_of_one_over_sqrt_512():
  plan = ext.extension().persistent_plan(addresses(), 4, 8, True)
  assert plan["kernargs"][0x70:0x74] == np.float32(1 / np.sqrt(512)).tobytes()


def test_planner_config_override():
  a = addresses()
  plan = ext.extension().persistent_plan(a, 4, 8, True, planner_config=5 | (2 << 8))
  assert plan["kernargs"] == expected_kernargs(a, num_rows=4, num_partitions=8,
                                               config=5 | (2 << 8))


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_rows=32769, num_partitions=8), "at most 32768 rows"),
    (dict(num_rows=4, num_partitions=0), r"num_partitions must be in \[1, 1024\]"),
    (dict(num_rows=4, num_partitions=1025), r"num_partitions must be in \[1, 1024\]"),
    (dict(num_rows=4, num_partitions=8, num_heads=64), "exactly 128 query heads, got 64"),
])
def test_plan_refusals(kwargs, message):
  with pytest.raises(ValueError, match=message):
    ext.extension().persistent_plan(addresses(), return_lse=True, **kwargs)


@pytest.mark.parametrize("missing", ["q", "kv_indices", "sink", "cnt", "arange", "o_acc"])
def test_plan_refuses_null_addresses(missing):
  a = addresses()
  a[missing] = 0
  with pytest.raises(ValueError, match=f"address of {missing} is null"):
    ext.extension().persistent_plan(a, 4, 8, True)


def test_null_lse_is_fine_without_return_lse_only():
  a = addresses()
  a["lse"] = 0
  assert ext.extension().persistent_plan(a, 4, 8, False)["kernargs"][0x18:0x20] == bytes(8)
  with pytest.raises(ValueError, match="lse"):
    ext.extension().persistent_plan(a, 4, 8, True)
