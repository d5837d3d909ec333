"""The launch-fault matrix, for both kernels, against the stand-in libamdhip64 (tests/hip_stub).

Each fault is injected, the launch is attempted, and the test checks that a Python exception
names the kernel and the cause; then the fault is cleared and a launch in the same process
succeeds (nothing aborted, nothing left cached in a broken state). FAULTS below is the list the
closing note of issue 5 reports (fault -> what the user sees).
"""

import ctypes

import pytest

from jax_mla._src import ext
from test_hip_launcher import IMAGE, libs  # noqa: F401  (fixture)
from test_persistent_kernargs import addresses
from test_split_kernargs import ADDRESSES

KERNELS = ("mla_v4_nm", "mla_v4_nm_ps")
SYMBOLS = {"mla_v4_nm": "_ZN5aiter36mla_a8w8_qh64_qseqlen1_gqaratio64_nmE",
           "mla_v4_nm_ps": "_ZN5aiter39mla_a8w8_qh64_qseqlen1_gqaratio64_nm_psE"}
STREAM = 0x5EED


def launch(kernel, device=0):
  e = ext.extension()
  if kernel == "mla_v4_nm":
    e.hip_launch_split(ADDRESSES, 2, 16, 1, 2, STREAM, device)
  else:
    e.hip_launch_persistent(addresses(), 1, 8, True, STREAM, device)


@pytest.fixture
def stub(libs):  # noqa: F811
  e = ext.extension()
  e.set_hip_library(libs["fake"])
  lib = ctypes.CDLL(libs["fake"])  # the same loaded object the launcher dlopen'ed
  lib.fake_symbol.restype = ctypes.c_char_p
  lib.fake_set_arch(b"gfx950:sramecc+:xnack-")
  lib.fake_fail(0, 0)
  lib.fake_fail_symbol(0)
  lib.fake_reset()
  for kernel in KERNELS:  # a fresh image drops modules cached by earlier tests
    e.register_code_object(kernel, IMAGE)
  yield lib
  lib.fake_set_arch(b"gfx950:sramecc+:xnack-")
  lib.fake_fail(0, 0)
  lib.fake_fail_symbol(0)
  e.set_hip_library(libs["fake"])


def inject(fault, lib, libs):  # noqa: F811
  """Applies `fault`; returns (device to launch on, regex the message must match)."""
  e = ext.extension()
  if fault == "library missing":
    e.set_hip_library("/nonexistent/libamdhip64.so.7")
    return 0, r"(?s)could not load the HIP runtime.*/nonexistent/libamdhip64\.so\.7.*No such file"
  if fault == "library lacks a HIP function":
    e.set_hip_library(libs["missing"])
    return 0, r"HIP symbol hipGetDevicePropertiesR0600 not found in .*libmissing\.so"
  if fault == "module load":
    lib.fake_fail(98, 0)
    return 2, r"hipModuleLoadData failed for kernel {k} on device 2: hipErrorInvalidImage \(code 98\)"
  if fault == "symbol lookup":
    lib.fake_fail_symbol(500)
    return 0, (r"hipModuleGetFunction\({s}\) failed for kernel {k} on device 0: "
               r"hipErrorNotFound \(code 500\)")
  if fault == "launch":
    lib.fake_fail(0, 719)
    return 1, (r"hipModuleLaunchKernel failed for kernel {k} on device 1: "
               r"hipErrorLaunchFailure \(code 719\)")
  if fault == "gfx942 device":
    lib.fake_set_arch(b"gfx942:sramecc+:xnack-")
    return 3, r"kernel {k} needs a gfx950 device; device 3 is 'gfx942:sramecc\+:xnack-'"
  if fault == "no such device":
    return 9, r"hipGetDevicePropertiesR0600\(device 9\) failed: hipErrorInvalidDevice \(code 101\)"
  raise ValueError(fault)


FAULTS = ("library missing", "library lacks a HIP function", "module load", "symbol lookup",
          "launch", "gfx942 device", "no such device")
# Faults whose message (from csrc/hip/hip_runtime.cc, launcher.cc ArchOf) does not yet name the
# kernel. strict: these xfails turn into failures once the C++ adds the kernel name.
UNNAMED: set[str] = set()  # every fault names the kernel (it once was three that did not)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fault", FAULTS)
def test_fault_is_a_python_exception_naming_the_cause(stub, libs, kernel, fault):  # noqa: F811
  device, cause = inject(fault, stub, libs)
  cause = cause.format(k=kernel, s=SYMBOLS[kernel])
  with pytest.raises(RuntimeError, match=cause):
    launch(kernel, device)
  assert stub.fake_launches() == 0


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fault", FAULTS)
def test_fault_message_names_the_kernel(stub, libs, kernel, fault, request):  # noqa: F811
  if fault in UNNAMED:
    request.applymarker(pytest.mark.xfail(
        strict=True, reason="the C++ message names the cause but not the kernel"))
  device, _ = inject(fault, stub, libs)
  with pytest.raises(RuntimeError) as info:
    launch(kernel, device)
  assert f"kernel {kernel}" in str(info.value)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_module_whose_symbol_lookup_fails_is_unloaded(stub, libs, kernel):  # noqa: F811
  inject("symbol lookup", stub, libs)
  for attempt in range(1, 4):  # each failed launch loads the module again, and unloads it
    with pytest.raises(RuntimeError, match="hipModuleGetFunction"):
      launch(kernel, 0)
    assert stub.fake_loads() == attempt and stub.fake_unloads() == attempt
  stub.fake_fail_symbol(0)
  launch(kernel, 0)  # a module that works stays loaded (cached), and is used
  assert stub.fake_loads() == 4 and stub.fake_unloads() == 3 and stub.fake_launches() == 1


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fault", FAULTS)
def test_process_recovers_after_the_fault(stub, libs, kernel, fault):  # noqa: F811
  device, _ = inject(fault, stub, libs)
  with pytest.raises(RuntimeError):
    launch(kernel, device)
  stub.fake_set_arch(b"gfx950:sramecc+:xnack-")
  stub.fake_fail(0, 0)
  stub.fake_fail_symbol(0)
  ext.extension().set_hip_library(libs["fake"])
  launch(kernel, 0)  # the same process launches once the fault is gone
  assert stub.fake_launches() == 1
  assert stub.fake_symbol().decode() == SYMBOLS[kernel]
