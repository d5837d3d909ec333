"""The README's first command: the demo runs, prints its comparison (agreement, and time against
the reference), and reports no non-finite."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.child_process import child_env


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
  if backend == "auto":  # the host backend, timed in turn with the reference
    assert re.search(r"host plan: \d+ KV splits? x 3 sequences on \d+ threads", result.stdout)
    assert re.search(r"reference: [0-9.]+ ms per call \(timed in turn with it\): host is "
                     r"[0-9.]+x the reference", result.stdout), result.stdout


def test_cli_usage():
  result = subprocess.run([sys.executable, "-m", "jax_mla"], capture_output=True, text=True,
                          check=False)
  assert result.returncode == 2 and "demo" in result.stdout and "info" in result.stdout


def test_a_package_without_its_extension_says_so_loudly(tmp_path):
  """A copy of the package without the compiled extension (a source tree on sys.path by
  accident) still runs the demo, on the reference, and says on stderr why it is not the host
  backend; decode itself warns."""
  import shutil  # pylint: disable=import-outside-toplevel
  import jax_mla  # pylint: disable=import-outside-toplevel
  package = Path(jax_mla.__file__).parent
  shutil.copytree(package, tmp_path / "jax_mla",
                  ignore=shutil.ignore_patterns("_ext*", "__pycache__"))
  env = dict(child_env(), PYTHONPATH=str(tmp_path))
  # `python -m jax_mla`, except that an editable install's import hook (setuptools' or
  # scikit-build-core's, on sys.meta_path ahead of sys.path) is dropped, so that the copy is
  # what imports there too.
  run_copy = ("import runpy, sys; "
              "sys.meta_path[:] = [f for f in sys.meta_path "
              "if 'editable' not in type(f).__module__]; "
              "import jax_mla; print('imported from', jax_mla.__file__, file=sys.stderr); "
              "runpy.run_module('jax_mla', run_name='__main__', alter_sys=True)")
  result = subprocess.run(
      [sys.executable, "-c", run_copy, "demo", "--batch", "2",
       "--heads", "16", "--max-len", "8", "--pool-rows", "16", "--repeats", "1"],
      capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path, env=env)
  assert result.returncode == 0, result.stdout + result.stderr
  assert f"imported from {tmp_path / 'jax_mla'}" in result.stderr, result.stderr
  assert "backend: auto -> reference" in result.stdout, result.stdout
  assert "non-finite values 0" in result.stdout, result.stdout
  assert "WARNING: the C++ extension is missing" in result.stderr, result.stderr
  assert "MissingExtensionWarning: jax_mla: backend='auto' runs the slower pure-JAX reference" \
      in result.stderr, result.stderr


def test_auto_on_a_cpu_without_the_extension_warns(monkeypatch):
  from jax_mla._src import backends  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(backends, "host_available", lambda: (False, "not built"))
  with pytest.warns(backends.MissingExtensionWarning, match="reference: .*not built"):
    assert backends.resolve("auto").name == "reference"
