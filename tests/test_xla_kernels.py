"""benchmarks/xla_kernels.py's reading of an optimized HLO module (its compile for a Hopper needs
jax's CUDA plugin): which instructions of the timed loop's body launch kernels; and what its
--mosaic-dump keeps and prints."""

import os

import pytest

import xla_kernels

# The shape of XLA's printout: a fused computation, the loop's body and condition, the entry.
MODULE = """HloModule jit_run, entry_computation_layout={(s32[8,512]{1,0})->bf16[8,128,512]{2,1,0}}

%fused_select (param_0: f32[8,8,128]) -> f32[8,8,128] {
  %param_0 = f32[8,8,128]{2,1,0} parameter(0)
  ROOT %select.1 = f32[8,8,128]{2,1,0} select(%c, %param_0, %param_0)
}

%body.3 (arg_tuple.7: (s32[], bf16[8,128,512])) -> (s32[], bf16[8,128,512]) {
  %arg_tuple.7 = (s32[], bf16[8,128,512]) parameter(0)
  %loop_add_fusion = s32[] fusion(%gte.1), kind=kLoop, calls=%fused_add, metadata={op_name="x"}
  %mpmd_map.15 = (f32[8,8,128,512]{3,2,1,0}, f32[8,8,128]{2,1,0}) custom-call(%a, %b), custom_call_target="mosaic_gpu_v2", backend_config={module = "ML\\EFR"}
  %gte.2 = f32[8,8,128]{2,1,0} get-tuple-element(%mpmd_map.15), index=1
  %loop_select_fusion = f32[8,8,128]{2,1,0} fusion(%gte.2), kind=kLoop, calls=%fused_select
  ROOT %loop_reduce_fusion = bf16[8,128,512]{2,1,0} fusion(%gte.2, %loop_select_fusion), kind=kInput, calls=%fused_reduce
}

%cond.4 (arg_tuple.8: (s32[], bf16[8,128,512])) -> pred[] {
  ROOT %loop_compare_fusion = pred[] fusion(%gte.3), kind=kLoop, calls=%fused_compare
}

ENTRY %main.14 (a_4_.1: s32[8,512]) -> bf16[8,128,512] {
  %loop_and_fusion.1 = s32[8,512]{1,0} fusion(%a_4_.1), kind=kLoop, calls=%fused_and.1
  %while.1 = (s32[], bf16[8,128,512]{2,1,0}) while(%tuple.11), condition=%cond.4, body=%body.3, backend_config={"known_trip_count":{"n":"29"}}
  ROOT %gte.9 = bf16[8,128,512]{2,1,0} get-tuple-element(%while.1), index=1
}
"""


def test_the_loop_body_kernels_are_its_fusions_and_custom_calls_in_order():
  assert xla_kernels.loop_body_launches(MODULE) == [
      ("loop_add_fusion", "fusion kLoop -> s32[]"),
      ("mpmd_map.15",
       "custom-call mosaic_gpu_v2 -> (f32[8,8,128,512]{3,2,1,0}, f32[8,8,128]{2,1,0})"),
      ("loop_select_fusion", "fusion kLoop -> f32[8,8,128]{2,1,0}"),
      ("loop_reduce_fusion", "fusion kInput -> bf16[8,128,512]{2,1,0}"),
  ]


def test_computations_are_split_with_the_entry_named_entry():
  comps = xla_kernels.computations(MODULE)
  assert set(comps) == {"%fused_select", "%body.3", "%cond.4", "ENTRY"}
  assert [name for name, _ in xla_kernels.launches(comps["ENTRY"])] == ["loop_and_fusion.1"]
  # Instructions inside a fused computation are not kernels of their own.
  assert xla_kernels.launches(comps["%fused_select"]) == []


def test_a_module_without_exactly_one_loop_is_refused():
  with pytest.raises(ValueError, match="one while loop"):
    xla_kernels.loop_body_launches(MODULE.replace("body=%body.3", "nobody=%body.3"))


# What ptxas wrote for the Mosaic kernel at 16 x 4, B 32, K 512 (xla_kernels.py --mosaic-dump,
# 2026-12-08), and a second kernel's file beside it.
PTXAS = """\
ptxas warning : Registers are spilled to local memory in function 'anonymous_mosaic_gpu_kernel', 8 bytes spill stores, 12 bytes spill loads
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'anonymous_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for anonymous_mosaic_gpu_kernel
    8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 168 registers, used 16 barriers, 8 bytes cumulative stack size, 1 bytes smem
ptxas info    : Compile time = 1050.626 ms
"""


def test_mosaic_dump_sets_the_folder_while_compiling_and_restores_it(tmp_path, monkeypatch):
  monkeypatch.setenv("MOSAIC_GPU_DUMP_TO", "/elsewhere")
  folder = tmp_path / "a" / "b"
  with xla_kernels.mosaic_dump(str(folder)):
    assert os.environ["MOSAIC_GPU_DUMP_TO"] == str(folder)
    assert folder.is_dir()  # Mosaic prints to stdout where it is missing
    for name in ("anonymous_0.mlir-passes.log", "anonymous_0.ptx", "anonymous_0.ptxas"):
      (folder / name).write_text("x")
  assert os.environ["MOSAIC_GPU_DUMP_TO"] == "/elsewhere"
  assert sorted(p.name for p in folder.iterdir()) == ["anonymous_0.ptx", "anonymous_0.ptxas"]
  monkeypatch.delenv("MOSAIC_GPU_DUMP_TO")
  with xla_kernels.mosaic_dump(str(tmp_path / "c")):
    pass
  assert "MOSAIC_GPU_DUMP_TO" not in os.environ
  with xla_kernels.mosaic_dump(None):
    assert "MOSAIC_GPU_DUMP_TO" not in os.environ


def test_ptxas_lines_give_each_kernels_registers_spills_and_notes(tmp_path):
  (tmp_path / "anonymous_0.ptxas").write_text(PTXAS)
  (tmp_path / "anonymous_1.ptxas").write_text(
      PTXAS.replace("168 registers", "152 registers").replace("8 bytes spill", "0 bytes spill")
      .replace("12 bytes spill", "0 bytes spill") +
      "ptxas info    : (C7507) Potential Performance Loss: 'setmaxnreg' ignored to maintain "
      "minimum register requirements.\n")
  (tmp_path / "anonymous_0.ptx").write_text("Used 1 registers")  # not a ptxas report
  assert xla_kernels.ptxas_lines(str(tmp_path)) == [
      "anonymous_0.ptxas: 168 registers, spills 8 B stored / 12 B loaded",
      "anonymous_1.ptxas: 152 registers, spills 0 B stored / 0 B loaded; C7507 Potential "
      "Performance Loss: 'setmaxnreg' ignored to maintain minimum register requirements."]
  assert xla_kernels.ptxas_lines(str(tmp_path / "nothing")) == []
