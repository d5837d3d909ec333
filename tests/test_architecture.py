"""The package's shape (docs/architecture.md): no import circles, and one home per fact."""

from __future__ import annotations

import ast
import pathlib
import re

import jax_mla

PACKAGE = pathlib.Path(jax_mla.__file__).parent


def module_imports() -> dict[str, set[str]]:
  """jax_mla module -> the jax_mla modules it imports (anywhere in it, lazy imports included)."""
  files = {}
  for path in PACKAGE.rglob("*.py"):
    parts = ("jax_mla",) + path.relative_to(PACKAGE).with_suffix("").parts
    files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  graph = {}
  for name, path in files.items():
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jax_mla"):
        found.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files
                     else node.module for a in node.names)
      elif isinstance(node, ast.Import):
        found.update(a.name for a in node.names if a.name.startswith("jax_mla"))
    graph[name] = {m for m in found if m in files and m != name}
  return graph


def cycles(graph):
  found, done = [], set()

  def visit(node, path):
    for dep in graph[node]:
      if dep in path:
        found.append(path[path.index(dep):] + [dep])
      elif dep not in done:
        visit(dep, path + [dep])
    done.add(node)

  for node in graph:
    if node not in done:
      visit(node, [node])
  return found


def test_the_graph_is_read():
  graph = module_imports()
  assert "jax_mla._src.backends" in graph["jax_mla._src.api"]
  assert "jax_mla._src.aiter.guards" in graph["jax_mla._src.aiter.split"]


def test_no_import_circles():
  assert cycles(module_imports()) == []


def test_a_planted_circle_is_found():
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_the_lse_merge_imports_no_pallas():
  """lse_merge serves the API's merge of two sources too, which must not need Pallas."""
  tree = ast.parse((PACKAGE / "_src" / "lse_merge.py").read_text())
  imported = [a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
              for a in node.names]
  imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
  assert imported and not [m for m in imported if "pallas" in m or m.startswith("jax_mla")]


def test_each_fact_is_defined_once():
  """HEAD_DIM and ROPE_DIM live in layout.py, the backend names in the registry, the served
  layouts in the manifest (which test_split_lowering holds the C++ plan to)."""
  sources = {p: p.read_text() for p in PACKAGE.rglob("*.py")}
  for fact, home in (("HEAD_DIM", "layout.py"), ("ROPE_DIM", "layout.py"),
                     ("DEFAULT_SOFTMAX_SCALE", "layout.py"), ("SOFTMAX_SCALE", None),
                     ("BACKENDS", "backends.py"), ("SUPPORTED_SHAPES", None),
                     ("SPLIT_KERNEL_PAIRS", None)):
    defined = [p.name for p, text in sources.items()
               if re.search(rf"^{fact}\s*[:=]", text, re.M)]
    assert defined == ([home] if home else []), (fact, defined)
