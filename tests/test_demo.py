"""The README's first command: the demo runs, prints its comparison, and reports no non-finite."""

import subprocess
import sys

import pytest

from child_process import child_env


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_demo_runs_small(backend, tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "jax_mla", "demo", "--batch", "3", "--heads", "16", "--max-len",
       "40", "--pool-rows", "128", "--repeats", "2", "--backend", backend],
      capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path, env=child_env())
  assert result.returncode == 0, result.stdout + result.stderr
  assert "time per call" in result.stdout
  assert "non-finite values 0" in result.stdout
  assert "out == 0 and lse == sink: True" in result.stdout


def test_cli_usage():
  result = subprocess.run([sys.executable, "-m", "jax_mla"], capture_output=True, text=True,
                          check=False)
  assert result.returncode == 2 and "demo" in result.stdout and "info" in result.stdout
