"""The README's first command: the demo runs, prints its comparison, and reports no non-finite."""

import os
import subprocess
import sys

import pytest

import jax_mla

# The subprocess must import the same jax_mla as this process (installed, or a source checkout
# on PYTHONPATH), whatever its working directory.
_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [os.path.dirname(os.path.dirname(os.path.abspath(jax_mla.__file__)))]
    + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_demo_runs_small(backend, tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "jax_mla", "demo", "--batch", "3", "--heads", "16", "--max-len",
       "40", "--pool-rows", "128", "--repeats", "2", "--backend", backend],
      capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path, env=_ENV)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "time per call" in result.stdout
  assert "non-finite values 0" in result.stdout
  assert "out == 0 and lse == sink: True" in result.stdout


def test_cli_usage():
  result = subprocess.run([sys.executable, "-m", "jax_mla"], capture_output=True, text=True,
                          check=False)
  assert result.returncode == 2 and "demo" in result.stdout and "info" in result.stdout
