"""Executes every notebook under notebooks/ on the CPU; a notebook that raises fails its test.

The notebooks are jupytext MyST Markdown (the reviewable source of truth). Each one is converted to
a plain Python script with jupytext (its code cells, in order) and run in a fresh interpreter with
`MPLBACKEND=Agg`, its working directory notebooks/ (so the notebooks find the repository the way
Jupyter does) and its figures written to a temporary directory, so a test run never touches the
committed PNGs. Then every figure the notebook's text links (`](figures/NAME.png)`) must have been
written by the run and be committed under notebooks/figures/.

To regenerate the committed figures: `python tests/test_notebooks.py [NAME.md ...]`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from support.child_process import child_env

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TIMEOUT_S = 300  # per notebook; together they take well under a minute on one core
FIGURE_LINK = re.compile(r"\]\(figures/([\w.-]+\.png)\)")


def notebook_script(path: Path) -> str:
  """The code cells of a jupytext notebook as one Python script."""
  try:
    import jupytext  # pylint: disable=import-outside-toplevel
  except ImportError as e:  # fail, not skip: CI installs .[test], which includes it
    raise ImportError("the notebook tests need the notebooks extra: pip install -e '.[notebooks]' "
                      "(matplotlib, jupytext)") from e
  nb = jupytext.read(path)
  cells = [c.source for c in nb.cells if c.cell_type == "code"]
  if not cells:
    raise ValueError(f"{path} has no code cells (is its jupytext header there?)")
  return "\n\n".join(cells) + "\n"


def run_notebook(path: Path, figures: Path, timeout: float = TIMEOUT_S):
  """Runs a notebook's code as a script; returns the CompletedProcess."""
  figures.mkdir(parents=True, exist_ok=True)
  script = Path(tempfile.mkdtemp(prefix="notebook_")) / f"{path.stem}.py"
  script.write_text(notebook_script(path))
  # The child imports the same jax_mla as this process (child_process), whatever its cwd.
  env = child_env(MPLBACKEND="Agg", JAX_MLA_FIGURES=str(figures),
                  JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  return subprocess.run([sys.executable, str(script)], cwd=path.parent, env=env,
                        capture_output=True, text=True, timeout=timeout, check=False)


def linked_figures(path: Path) -> list[str]:
  return FIGURE_LINK.findall(path.read_text())


NOTEBOOK_FILES = sorted(p for p in NOTEBOOKS.glob("*.md") if p.name != "README.md")


def test_there_are_notebooks():
  names = {p.name for p in NOTEBOOK_FILES}
  assert {"rows.md", "decode.md", "planner.md", "performance.md"} <= names


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.name)
def test_notebook_runs_clean(path, tmp_path):
  t0 = time.perf_counter()
  result = run_notebook(path, tmp_path / "figures")
  took = time.perf_counter() - t0
  assert result.returncode == 0, (
      f"{path.name} failed (rc {result.returncode}) after {took:.0f} s:\n"
      f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
  links = linked_figures(path)
  assert links, f"{path.name} links no figure under figures/"
  for name in links:
    assert (tmp_path / "figures" / name).is_file(), f"{path.name} links {name} but did not write it"
    assert (NOTEBOOKS / "figures" / name).is_file(), (
        f"{path.name} links figures/{name}, which is not committed; regenerate with "
        "`python tests/test_notebooks.py`")


def test_a_raising_notebook_fails(tmp_path):
  """The runner must see an exception in a cell: this is what makes the tests above able to fail."""
  pytest.importorskip("jupytext")
  bad = tmp_path / "nb" / "bad.md"
  bad.parent.mkdir()
  bad.write_text("---\njupytext:\n  text_representation:\n    extension: .md\n"
                 "    format_name: myst\nkernelspec:\n  display_name: Python 3\n"
                 "  language: python\n  name: python3\n---\n\n# Bad\n\n"
                 "```{code-cell} ipython3\nx = 1\n```\n\n"
                 "```{code-cell} ipython3\nraise RuntimeError('cell 2 fails')\n```\n")
  result = run_notebook(bad, tmp_path / "figures")
  assert result.returncode != 0
  assert "cell 2 fails" in result.stderr


if __name__ == "__main__":
  # Regenerates the committed figures in place.
  names = sys.argv[1:] or [p.name for p in NOTEBOOK_FILES]
  for name in names:
    t0 = time.perf_counter()
    r = run_notebook(NOTEBOOKS / name, NOTEBOOKS / "figures", timeout=3600)
    print(f"{name}: rc {r.returncode} in {time.perf_counter() - t0:.1f} s")
    if r.returncode:
      print(r.stdout[-3000:], r.stderr[-6000:])
      sys.exit(1)
