"""Running a child Python that imports the same jax_mla as the test process.

`python -c` and `python -m` put the working directory first on sys.path, so a child started from
a source checkout would import the unbuilt sources instead of the installed package: children run
from a neutral directory, with the imported package's parent and tests/ (for support/) first on
PYTHONPATH.
"""

from __future__ import annotations

import os
import tempfile

import jax_mla

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, above support/
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(jax_mla.__file__)))


def child_env(**extra: str) -> dict:
  existing = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
  return dict(os.environ, PYTHONPATH=os.pathsep.join([PACKAGE_PARENT, TESTS_DIR] + existing),
              **extra)


def neutral_cwd() -> str:
  """A directory holding no jax_mla sources."""
  return tempfile.mkdtemp(prefix="jax_mla_child_")
