"""tools/ptxas_report.py: ptxas's output parsed, and the PTX rewrites it compiles (launch size,
setmaxnreg counts) change only what they name."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import ptxas_report  # noqa: E402  pylint: disable=wrong-import-position

PTX = """\
.visible .entry k(
\t.param .u64 k_param_0
)
.maxntid 512, 1, 1
{
\tsetp.lt.s32 \t%p1, %r5, 2;
\t@%p1 bra \t$L__BB0_2;
\tsetmaxnreg.dec.sync.aligned.u32 80;
\tbra.uni \t$L__BB0_3;
$L__BB0_2:
\tsetmaxnreg.inc.sync.aligned.u32 232;
$L__BB0_3:
\tret;
}
"""

COMPILED = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : (C7507) Potential Performance Loss: 'setmaxnreg' ignored to maintain minimum register requirements.
ptxas info    : Function properties for k
    296 bytes stack frame, 408 bytes spill stores, 424 bytes spill loads
ptxas info    : Used 168 registers, used 16 barriers, 296 bytes cumulative stack size, 1 bytes smem
"""

REFUSED = """\
ptxas fatal   : (C7602) Insufficient registers (128) to compile instruction at line 5049 in function k. Try to compile with register target of 158 or higher.
ptxas fatal   : Ptx assembly aborted due to errors
"""


def test_a_compiled_kernel_reports_registers_spills_and_notes():
  report = ptxas_report.parse_ptxas(COMPILED)
  assert report == ptxas_report.Report(
      registers=168, spill_stores=408, spill_loads=424,
      notes=("C7507 Potential Performance Loss: 'setmaxnreg' ignored to maintain minimum "
             "register requirements.",), fatal=())


def test_a_refused_kernel_reports_why_and_no_registers():
  report = ptxas_report.parse_ptxas(REFUSED)
  assert report.registers is None
  assert report.fatal == ("(C7602) Insufficient registers (128) to compile instruction at line "
                          "5049 in function k. Try to compile with register target of 158 or "
                          "higher.",)
  assert report.notes == ()


def test_setmaxnreg_sites_are_found_with_their_lines():
  assert ptxas_report.setmaxnreg_sites(PTX) == [(8, "dec", 80), (11, "inc", 232)]


def test_maxntid_rewrite_changes_only_the_directive():
  rewritten = ptxas_report.with_maxntid(PTX, 384)
  assert ".maxntid 384, 1, 1" in rewritten
  assert rewritten.replace(".maxntid 384", ".maxntid 512") == PTX
  with pytest.raises(ValueError, match="exactly one"):
    ptxas_report.with_maxntid(PTX.replace(".maxntid 512, 1, 1\n", ""), 384)


def test_setmaxnreg_rewrite_changes_only_its_count():
  rewritten = ptxas_report.with_setmaxnreg(PTX, 11, 32)
  assert ptxas_report.setmaxnreg_sites(rewritten) == [(8, "dec", 80), (11, "inc", 32)]
  assert rewritten.replace("u32 32;", "u32 232;") == PTX
  # Rewriting a count whose digits also occur in the instruction's ".u32" keeps the type.
  again = ptxas_report.with_setmaxnreg(rewritten, 11, 40)
  assert "setmaxnreg.inc.sync.aligned.u32 40;" in again
  assert again.replace("u32 40;", "u32 232;") == PTX
  with pytest.raises(ValueError, match="no setmaxnreg on line 9"):
    ptxas_report.with_setmaxnreg(PTX, 9, 128)
  with pytest.raises(ValueError, match="no setmaxnreg on line 99"):
    ptxas_report.with_setmaxnreg(PTX, 99, 128)


SASS = """\
        /*0120*/                   STL [R1+0x44], R5                                (*"SpillRefill"*);
        /*07f0*/                   USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xd8 ;
        /*0800*/                   LDL R187, [R1+0x44]                              (*"SpillRefill"*);
        /*0810*/                   LDL.LU R2, [R1+0x4c]                             (*"SpillRefill"*);
        /*0820*/                   LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;
        /*9750*/                   USETMAXREG.DEALLOC.CTAPOOL 0xa0 ;
        /*9760*/                   STS.128 [R3], R8 ;
        /*bf40*/                   USETMAXREG.DEALLOC.CTAPOOL 0x80 ;
        /*bf50*/                   STL.64 [R1], R6                                  (*"SpillRefill"*);
"""


def test_spills_are_counted_by_the_region_each_setmaxnreg_opens():
  # Global and shared loads and stores (LDG, STS) are not spills.
  assert ptxas_report.spills_by_region(SASS) == [("entry", 1), (216, 2), (160, 0), (128, 1)]
