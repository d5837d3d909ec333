"""The HIP launcher against a stand-in libamdhip64 (tests/hip_stub): library loading, the arch
check, module caching per device, and exactly what reaches hipModuleLaunchKernel."""

import ctypes
import pathlib
import shutil
import subprocess
import sys

import pytest

from support.child_process import child_env, neutral_cwd
from jax_mla._src import ext
from test_split_kernargs import ADDRESSES

STUB_DIR = pathlib.Path(__file__).parent / "hip_stub"

NM_SYMBOL = "_ZN5aiter36mla_a8w8_qh64_qseqlen1_gqaratio64_nmE"
IMAGE = b"\x7fELF-not-really-a-code-object" + bytes(range(64))


def build(src, out):
  compiler = shutil.which("g++") or shutil.which("c++")
  if compiler is None:
    pytest.skip("no C++ compiler to build the stand-in HIP library")
  subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True)
  return str(out)


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
  d = tmp_path_factory.mktemp("hip")
  yield {"fake": build(STUB_DIR / "fake_amdhip64.cc", d / "libfakehip.so"),
         "missing": build(STUB_DIR / "missing_symbol.cc", d / "libmissing.so")}
  ext.extension().set_hip_library("")


def last_launch(lib):
  """(grid + block + shared memory, stream, kernelParams, kernarg bytes) of the stub's last
  hipModuleLaunchKernel call."""
  geometry = (ctypes.c_uint * 7)()
  stream, params = ctypes.c_void_p(), ctypes.c_void_p()
  kernargs = (ctypes.c_ubyte * 1024)()
  size = ctypes.c_size_t()
  lib.fake_last_launch(geometry, ctypes.byref(stream), ctypes.byref(params), kernargs,
                       ctypes.byref(size))
  return tuple(geometry), stream.value, params.value, bytes(kernargs[:size.value])


@pytest.fixture
def fake(libs):
  e = ext.extension()
  e.set_hip_library(libs["fake"])
  lib = ctypes.CDLL(libs["fake"])  # the same loaded object the launcher dlopen'ed
  lib.fake_symbol.restype = ctypes.c_char_p
  lib.fake_image_head.restype = ctypes.c_void_p
  lib.fake_set_arch(b"gfx950:sramecc+:xnack-")
  lib.fake_fail(0, 0)
  lib.fake_reset()
  yield lib
  lib.fake_set_arch(b"gfx950:sramecc+:xnack-")
  lib.fake_fail(0, 0)


def test_missing_library_is_named(libs):
  e = ext.extension()
  e.set_hip_library("/nonexistent/libamdhip64.so.7")
  status = e.hip_status()
  assert status["loaded"] is False
  assert "/nonexistent/libamdhip64.so.7" in status["reason"]
  with pytest.raises(RuntimeError, match="could not load the HIP runtime"):
    e.hip_prepare("mla_v4_nm", 0)


def test_missing_symbol_is_named(libs):
  e = ext.extension()
  e.set_hip_library(libs["missing"])
  status = e.hip_status()
  assert not status["loaded"]
  assert "hipGetDevicePropertiesR0600" in status["reason"] and libs["missing"] in status["reason"]


def test_default_search_names_every_candidate(libs):
  e = ext.extension()
  e.set_hip_library("")
  status = e.hip_status()
  if status["loaded"]:
    pytest.skip(f"a real HIP runtime is installed ({status['library']})")
  for name in ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"):
    assert name in status["reason"]


def test_no_code_object_registered(libs):
  # Other tests register images in this process (registrations are process-wide and cannot be
  # undone), so ask a fresh interpreter.
  script = (
      "from jax_mla._src import ext\n"
      "e = ext.extension()\n"
      f"e.set_hip_library({libs['fake']!r})\n"
      "assert not e.has_code_object('mla_v4_nm')\n"
      "try:\n"
      "  e.hip_prepare('mla_v4_nm', 0)\n"
      "except RuntimeError as err:\n"
      "  print(err)\n")
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=child_env(), cwd=neutral_cwd(), check=False)
  assert result.returncode == 0, result.stderr
  assert "no code object registered for kernel mla_v4_nm" in result.stdout, result.stdout


def test_register_code_object_rejects_bad_input():
  e = ext.extension()
  with pytest.raises(ValueError, match="unknown kernel id 'mla_v3'.*mla_v4_nm, mla_v4_nm_ps"):
    e.register_code_object("mla_v3", IMAGE)
  with pytest.raises(ValueError, match="empty image"):
    e.register_code_object("mla_v4_nm", b"")


def test_module_loaded_once_per_device(fake):
  e = ext.extension()
  e.register_code_object("mla_v4_nm", IMAGE)
  assert e.hip_status() == {"loaded": True, "library": e.hip_status()["library"]}
  e.hip_prepare("mla_v4_nm", 0)
  e.hip_prepare("mla_v4_nm", 0)
  assert fake.fake_loads() == 1
  assert fake.fake_symbol().decode() == NM_SYMBOL
  assert ctypes.string_at(fake.fake_image_head(), 16) == IMAGE[:16]
  e.hip_prepare("mla_v4_nm", 3)
  assert fake.fake_loads() == 2
  assert fake.fake_module_device() == 3  # loaded with device 3 current
  assert fake.fake_current_device() == 0  # and the caller's device restored
  e.register_code_object("mla_v4_nm", IMAGE + b"v2")  # a new image: loaded again on next use
  e.hip_prepare("mla_v4_nm", 0)
  assert fake.fake_loads() == 3


def test_wrong_arch_is_refused(fake):
  e = ext.extension()
  e.register_code_object("mla_v4_nm", IMAGE)
  fake.fake_set_arch(b"gfx942:sramecc+:xnack-")
  with pytest.raises(RuntimeError, match=r"needs a gfx950 device; device 1 is 'gfx942:sramecc\+"):
    e.hip_prepare("mla_v4_nm", 1)
  assert fake.fake_loads() == 0
  fake.fake_set_arch(b"gfx9500")  # a prefix is not enough
  with pytest.raises(RuntimeError, match="needs a gfx950 device"):
    e.hip_prepare("mla_v4_nm", 1)


@pytest.mark.parametrize("heads,msq,splits", [(128, 1, 4), (16, 4, 1), (64, 1, 16)])
def test_launch_passes_plan_bytes_and_geometry(fake, heads, msq, splits):
  e = ext.extension()
  e.register_code_object("mla_v4_nm", IMAGE)
  stream = 0xABCDEF12345
  e.hip_launch_split(ADDRESSES, 7, heads, msq, splits, stream, 0)
  plan = e.split_plan(ADDRESSES, 7, heads, msq, splits)
  geometry, got_stream, params, kernargs = last_launch(fake)
  assert fake.fake_launches() == 1
  assert geometry[:3] == plan["grid"] and geometry[3:6] == (256, 1, 1)
  assert geometry[6] == 0
  assert got_stream == stream and params is None
  assert len(kernargs) == 336 and kernargs == plan["kernargs"]


def test_launch_and_load_errors_name_kernel_and_hip_error(fake):
  e = ext.extension()
  e.register_code_object("mla_v4_nm", IMAGE)
  fake.fake_fail(0, 1)
  with pytest.raises(RuntimeError, match=r"hipModuleLaunchKernel failed for kernel mla_v4_nm on "
                                         r"device 0: hipErrorInvalidValue \(code 1\)"):
    e.hip_launch_split(ADDRESSES, 2, 16, 1, 2, 0, 0)
  fake.fake_fail(98, 0)
  with pytest.raises(RuntimeError, match=r"hipModuleLoadData failed for kernel mla_v4_nm on "
                                         r"device 2: hipErrorInvalidImage \(code 98\)"):
    e.hip_prepare("mla_v4_nm", 2)


def test_bad_plan_is_refused_before_hip(fake):
  e = ext.extension()
  e.register_code_object("mla_v4_nm", IMAGE)
  with pytest.raises(ValueError, match=r"\(24,1\)"):
    e.hip_launch_split(ADDRESSES, 2, 24, 1, 2, 0, 0)
  assert fake.fake_launches() == 0
