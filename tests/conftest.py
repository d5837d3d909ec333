# Test helpers are the package tests/support; pytest puts tests/ and benchmarks/ (the timing
# library the benchmark tests use) on sys.path (pyproject.toml, [tool.pytest.ini_options]).
import os

import pytest

# The tests run in one process per core (pytest-xdist, pyproject's addopts), which on a GPU
# machine share its GPUs: each takes memory as it needs it, not 75% of it up front. Set before
# any test imports jax.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def pytest_collection_modifyitems(config, items):
  """Tests marked gfx950 run only on an MI355X with verified code objects; elsewhere they skip
  with the reason (detection fails closed: an unknown device is not a gfx950)."""
  if not any("gfx950" in item.keywords for item in items):
    return
  from jax_mla._src import backends  # pylint: disable=import-outside-toplevel
  ok, why = backends.gfx950_available()
  if ok:
    return
  skip = pytest.mark.skip(reason=f"needs gfx950 hardware with AMD's code objects: {why}")
  for item in items:
    if "gfx950" in item.keywords:
      item.add_marker(skip)
