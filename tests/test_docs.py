"""Documentation checks: every public function documents shapes and dtypes; docs links resolve."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import jax_mla
import jax_mla.plan

ROOT = Path(__file__).resolve().parent.parent
# Written on another branch; drop an entry once its page has landed.
PENDING_PAGES: set[str] = set()
# Functions whose arguments and results are arrays: their docstrings must name shapes and dtypes.
ARRAY_FUNCTIONS = ["decode", "decode_persistent", "pack_rows", "unpack_rows", "to_flashmla",
                   "from_flashmla", "update_cache", "ragged_from_topk", "make_workspace",
                   "reset_workspace"]
DTYPE_WORDS = ("uint8", "bf16", "f32", "int32")


def public_objects():
  for name in jax_mla.__all__:
    yield f"jax_mla.{name}", getattr(jax_mla, name)
  for name in jax_mla.plan.__all__:
    obj = getattr(jax_mla.plan, name)
    if callable(obj):
      yield f"jax_mla.plan.{name}", obj


@pytest.mark.parametrize("name,obj", list(public_objects()),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_public_objects_have_docstrings(name, obj):
  doc = inspect.getdoc(obj) or ""
  assert len(doc) >= 60, f"{name} has no real docstring: {doc!r}"


@pytest.mark.parametrize("name", ARRAY_FUNCTIONS)
def test_array_functions_document_shapes_and_dtypes(name):
  doc = inspect.getdoc(getattr(jax_mla, name))
  assert re.search(r"\[[\w.,+ *]+\]", doc), f"jax_mla.{name}'s docstring names no shape"
  assert any(w in doc for w in DTYPE_WORDS), f"jax_mla.{name}'s docstring names no dtype"


def test_num_kv_splits_documents_its_arguments():
  doc = inspect.getdoc(jax_mla.plan.num_kv_splits)
  for arg in ("num_seqs", "num_heads", "kv_len_hint", "arch", "Returns"):
    assert arg in doc


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def markdown_files():
  return sorted([*ROOT.glob("docs/*.md"), *ROOT.glob("notebooks/*.md")])


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
  for target in LINK.findall(path.read_text()):
    if re.match(r"[a-z]+://", target):
      continue
    resolved = (path.parent / target).resolve()
    rel = resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else str(resolved)
    if rel in PENDING_PAGES:
      continue
    assert resolved.exists(), f"{path.relative_to(ROOT)} links {target}, which does not exist"


def test_docs_index_links_every_page():
  index = (ROOT / "docs" / "README.md").read_text()
  linked = set(LINK.findall(index))
  pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
  missing = sorted(pages - linked)
  assert not missing, f"docs/README.md does not link {missing}"
  assert "sharding.md" in linked and "adding_a_variant.md" in linked
