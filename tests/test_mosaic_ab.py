"""benchmarks/mosaic_ab.py's variant overrides (its timing needs a GPU: the GPU timing method is
tested in test_device_time.py): what a variant names must exist, and is set only while it
traces."""

import pytest

import mosaic_ab
from jax_mla._src.pallas import merge, plan
from jax_mla._src.pallas.mosaic import gather, kernel


def test_a_variant_overrides_constants_and_restores_them():
  before_registers, before_groups = kernel.REGISTERS, gather.CARRIED_GROUPS
  name, overrides = mosaic_ab.parse_variant(
      "both:kernel.REGISTERS={True: {0: 1, 1: 2, 2: 3}, False: {}};"
      "gather.CARRIED_GROUPS={True: 1, False: 4}")
  assert name == "both"
  with mosaic_ab.overridden(overrides):
    assert kernel.REGISTERS == {True: {0: 1, 1: 2, 2: 3}, False: {}}
    assert gather.CARRIED_GROUPS == {True: 1, False: 4}
  assert kernel.REGISTERS is before_registers and gather.CARRIED_GROUPS is before_groups


def test_the_split_merge_and_planner_can_be_varied():
  before_min, before_rule = merge.KERNEL_MERGE_MIN_SPLITS, plan.SPLIT_RULES
  _, overrides = mosaic_ab.parse_variant(
      "m:merge.KERNEL_MERGE_MIN_SPLITS=2;plan.SPLIT_RULES=('fill',)")
  with mosaic_ab.overridden(overrides):
    assert merge.KERNEL_MERGE_MIN_SPLITS == 2 and plan.SPLIT_RULES == ("fill",)
  assert merge.KERNEL_MERGE_MIN_SPLITS == before_min and plan.SPLIT_RULES is before_rule


def test_overrides_are_restored_when_the_trace_fails():
  before = gather.CARRIED_GROUPS
  _, overrides = mosaic_ab.parse_variant("x:gather.CARRIED_GROUPS={True: 9, False: 9}")
  with pytest.raises(RuntimeError):
    with mosaic_ab.overridden(overrides):
      raise RuntimeError("the kernel did not build")
  assert gather.CARRIED_GROUPS is before


@pytest.mark.parametrize("text", ["nocolon", "x:", "x:kernel.REGISTERS", "x:pair.X=1",
                                  "x:kernel.NO_SUCH_CONSTANT=1",
                                  "x:merge.NO_SUCH_CONSTANT=1", "x:lse_merge.X=1",
                                  "x:kernel.REGISTERS=not python"])
def test_malformed_variants_are_refused(text):
  with pytest.raises((ValueError, SyntaxError)):
    mosaic_ab.parse_variant(text)
