"""tools/mosaic_ir.py: the hashes it compares are stable across runs and change with what the
kernel's emitters emit (so equal hashes before and after a refactor mean the same module)."""

from __future__ import annotations

import os
import sys

import jax
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import mosaic_ir  # noqa: E402  pylint: disable=wrong-import-position

from jax_mla._src.pallas.mosaic import gather as mosaic_gather  # noqa: E402  pylint: disable=wrong-import-position


def test_hashes_are_stable_and_follow_the_emitted_module(monkeypatch):
  first = mosaic_ir.hashes(["unpaired", "paired"])
  if all(isinstance(h, str) for h in first.values()):
    pytest.skip(f"jax {jax.__version__} cannot parse the Mosaic module back: {first['paired']}")
  assert all(isinstance(h, list) and len(h) == 1 for h in first.values()), first
  assert mosaic_ir.hashes(["unpaired"])["unpaired"] == first["unpaired"]
  assert first["unpaired"] != first["paired"]
  # One row group fewer carried by the unpaired producer: a different module, a different hash.
  monkeypatch.setattr(mosaic_gather, "CARRIED_GROUPS", {True: 2, False: 1})
  changed = mosaic_ir.hashes(["unpaired", "paired"])
  assert changed["unpaired"] != first["unpaired"]
  assert changed["paired"] == first["paired"]
