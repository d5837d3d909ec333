"""gfx950 checks that need a fresh process: a guard-page out-of-bounds check (a fault kills the
child, not the test run), and command buffers on and off (XLA_FLAGS is read at start-up)."""

import pathlib
import subprocess
import sys

import numpy as np
import pytest

from support.child_process import child_env, neutral_cwd

pytestmark = pytest.mark.gfx950

CHILD = pathlib.Path(__file__).parent / "gfx950_child.py"


def run_child(mode, tmp_path, **env):
  out = tmp_path / f"{mode}.npz"
  r = subprocess.run([sys.executable, str(CHILD), mode, str(out)], capture_output=True, text=True,
                     env=child_env(**env), cwd=neutral_cwd(), timeout=600, check=False)
  assert r.returncode == 0 and "child ok" in r.stdout, (
      f"child {mode} exited {r.returncode}:\n{r.stderr[-4000:]}")
  assert "memory access fault" not in r.stderr.lower()
  return dict(np.load(out))


def test_inputs_at_the_end_of_their_allocations_are_read_in_bounds(tmp_path):
  # Platform allocator: every buffer is its own hipMalloc, so nothing of ours lies past the end.
  got = run_child("guard", tmp_path, XLA_PYTHON_CLIENT_ALLOCATOR="platform",
                  XLA_PYTHON_CLIENT_PREALLOCATE="false")
  for name, value in got.items():
    assert np.isfinite(value).all(), name
  np.testing.assert_allclose(got["out_split"], got["out_ps"], atol=2e-2 * np.abs(
      got["out_ps"]).max(), rtol=2e-2)


def test_command_buffers_on_and_off_give_the_same_results(tmp_path):
  off = run_child("scan", tmp_path, XLA_FLAGS="--xla_gpu_enable_command_buffer=")
  on = run_child("scan", tmp_path, XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL")
  for name in off:
    assert np.isfinite(off[name][np.isfinite(on[name])]).all(), name
    np.testing.assert_array_equal(off[name], on[name], err_msg=name)
