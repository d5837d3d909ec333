"""The nm kernel's plan: all 336 kernarg bytes and the grid, against KERNELS.md section 3.

The expected bytes are encoded here independently, slot by slot with struct.pack, from the table.
"""

import math
import struct

import pytest

from jax_mla._src import ext

SUPPORTED = [(16, 1), (16, 2), (16, 4), (32, 1), (64, 1), (128, 1)]
NAMES = ["out", "partial_lse", "valid_split_count", "q", "q_rope", "kv", "kv_rope", "kv_indptr",
         "kv_indices", "qo_indptr", "split_indptr", "sink"]
# Distinct, high addresses (above 2^32) so a truncated or swapped pointer shows.
ADDRESSES = {name: 0x7F00_0000_0000 + 0x1_0000_1000 * (i + 1) for i, name in enumerate(NAMES)}


def expected_kernargs(a, *, gqa, num_kv_splits):
  """KERNELS.md section 3, one 16-byte slot per row of the table, value first, rest zero."""
  split = num_kv_splits > 1
  slots = [
      ("Q", a["out"]),                            # 0 partials / bf16 out
      ("Q", a["partial_lse"] if split else 0),    # 1
      ("Q", a["q"]),                              # 2
      ("Q", a["kv"]),                             # 3
      ("Q", a["kv_indptr"]),                      # 4
      ("Q", a["kv_indices"]),                     # 5
      ("Q", 0),                                   # 6 kv_last_page_lens
      ("f", 1 / math.sqrt(512)),                  # 7
      ("I", gqa),                                 # 8
      ("I", num_kv_splits),                       # 9
      ("I", 0),                                   # 10 total_kv
      ("I", 0),                                   # 11 stride_page
      ("I", 0),                                   # 12 log2(page size)
      ("Q", a["qo_indptr"]),                      # 13
      ("Q", a["split_indptr"]),                   # 14
      ("I", 0 if split else 1),                   # 15 bf16 direct
      ("Q", a["q_rope"]),                         # 16
      ("Q", a["kv_rope"]),                        # 17
      ("Q", a["sink"]),                           # 18
      ("Q", a["valid_split_count"] if split else 0),  # 19
      ("I", 1 if split else 0),                   # 20
  ]
  assert len(slots) == 21
  return b"".join(struct.pack("<" + fmt, value).ljust(16, b"\0") for fmt, value in slots)


@pytest.mark.parametrize("num_kv_splits", [1, 2, 7, 16])
@pytest.mark.parametrize("gqa,msq", SUPPORTED)
def test_kernarg_bytes_and_grid(gqa, msq, num_kv_splits):
  num_seqs = 5
  plan = ext.extension().split_plan(ADDRESSES, num_seqs, gqa, msq, num_kv_splits)
  got, want = plan["kernargs"], expected_kernargs(ADDRESSES, gqa=gqa, num_kv_splits=num_kv_splits)
  assert len(got) == 336
  diff = [i for i in range(336) if got[i] != want[i]]
  assert not diff, f"kernarg bytes differ at offsets {[hex(i) for i in diff[:8]]}"
  sub_q = min(64, gqa * msq)
  assert plan["grid"] == (math.ceil(gqa * msq / sub_q), num_seqs, num_kv_splits)
  assert plan["block"] == (256, 1, 1)
  assert plan["shared_mem_bytes"] == 0
  assert plan["kernel"] == "mla_v4_nm"
  assert plan["symbol"] == "_ZN5aiter36mla_a8w8_qh64_qseqlen1_gqaratio64_nmE"


@pytest.mark.parametrize("gqa,msq,grid_x", [(16, 1, 1), (16, 2, 1), (16, 4, 1), (32, 1, 1),
                                            (64, 1, 1), (128, 1, 2)])
def test_grid_x_by_shape(gqa, msq, grid_x):
  plan = ext.extension().split_plan(ADDRESSES, 1, gqa, msq, 2)
  assert plan["grid"][0] == grid_x


@pytest.mark.parametrize("gqa,msq", [(8, 1), (16, 3), (32, 2), (64, 2), (128, 2), (256, 1)])
def test_unsupported_shape_is_named(gqa, msq):
  with pytest.raises(ValueError, match=rf"\({gqa},{msq}\).*\(16,1\) \(16,2\) \(16,4\) \(32,1\)"):
    ext.extension().split_plan(ADDRESSES, 2, gqa, msq, 2)


@pytest.mark.parametrize("num_kv_splits", [0, -3])
def test_bad_split_count(num_kv_splits):
  with pytest.raises(ValueError, match=f"num_kv_splits = {num_kv_splits}"):
    ext.extension().split_plan(ADDRESSES, 2, 16, 1, num_kv_splits)


def test_zero_sequences_rejected():
  with pytest.raises(ValueError, match="num_seqs = 0"):
    ext.extension().split_plan(ADDRESSES, 0, 16, 1, 2)


@pytest.mark.parametrize("missing,num_kv_splits", [("sink", 1), ("sink", 4), ("q", 2),
                                                   ("partial_lse", 2), ("valid_split_count", 3)])
def test_null_addresses_rejected(missing, num_kv_splits):
  addresses = dict(ADDRESSES, **{missing: 0})
  with pytest.raises(ValueError, match=missing):
    ext.extension().split_plan(addresses, 2, 16, 1, num_kv_splits)


def test_single_split_ignores_lse_and_count_addresses():
  addresses = dict(ADDRESSES, partial_lse=0, valid_split_count=0)
  plan = ext.extension().split_plan(addresses, 2, 16, 1, 1)
  assert plan["kernargs"] == expected_kernargs(ADDRESSES, gqa=16, num_kv_splits=1)


def test_unknown_address_name_rejected():
  with pytest.raises(ValueError, match="unknown address 'kv_page'"):
    ext.extension().split_plan(dict(ADDRESSES, kv_page=1), 2, 16, 1, 2)
