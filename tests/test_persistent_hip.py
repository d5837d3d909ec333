"""The persistent kernel's ROCm path (plan + LaunchOnHip) against the stand-in libamdhip64 of
tests/hip_stub: the nm_ps symbol is loaded, and hipModuleLaunchKernel receives the plan's 336
bytes, grid (2P, 1, 1), block 256 and no dynamic LDS."""


import pytest

from jax_mla._src import ext
from test_hip_launcher import IMAGE, fake, last_launch, libs  # noqa: F401  (fixtures)
from test_persistent_kernargs import addresses

PS_SYMBOL = "_ZN5aiter39mla_a8w8_qh64_qseqlen1_gqaratio64_nm_psE"


@pytest.mark.parametrize("num_rows,num_partitions,return_lse", [(1, 8, True), (64, 128, False),
                                                                (32768, 1024, True)])
def test_launch_passes_plan_bytes_and_geometry(fake, num_rows, num_partitions, return_lse):
  e = ext.extension()
  e.register_code_object("mla_v4_nm_ps", IMAGE)
  e.hip_launch_persistent(addresses(), num_rows, num_partitions, return_lse, 0x5151, 0)
  plan = e.persistent_plan(addresses(), num_rows, num_partitions, return_lse)
  geometry, stream, params, kernargs = last_launch(fake)
  assert fake.fake_launches() == 1
  assert fake.fake_symbol().decode() == PS_SYMBOL
  assert geometry == (2 * num_partitions, 1, 1, 256, 1, 1, 0)
  assert stream == 0x5151 and params is None
  assert kernargs == plan["kernargs"]


def test_bad_plan_never_reaches_hip(fake):
  e = ext.extension()
  e.register_code_object("mla_v4_nm_ps", IMAGE)
  with pytest.raises(ValueError, match="at most 32768 rows"):
    e.hip_launch_persistent(addresses(), 32769, 8, True, 0, 0)
  assert fake.fake_launches() == 0


def test_rocm_registration_is_an_initialize_execute_bundle():
  bundle = ext.extension().registrations()["ROCM"]["jax_mla_persistent_decode_v1"]
  assert set(bundle) == {"initialize", "execute"}
