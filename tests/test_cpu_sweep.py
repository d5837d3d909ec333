"""benchmarks/cpu_decode.py, the CPU sweep behind the README's table, at a tiny shape: every
implementation runs, the results file holds what the README quotes, and --table reads it back.
No time is asserted (benchmarks measure speed; tests hold what they report)."""

import json
import math

import pytest

import cpu_decode
from jax_mla._src import backends

pytestmark = pytest.mark.skipif(not backends.host_available()[0],
                                reason=f"no host backend: {backends.host_available()[1]}")


def test_sweep_writes_every_implementation_and_its_table(tmp_path):
  stem = str(tmp_path / "sweep")
  impls = ["reference", "host", "host-kernel", "host-xla-merge", "host-persistent"]
  rows, meta = cpu_decode.main(["--batch", "2", "--len", "64", "--rounds", "2", "--min-seconds",
                                "0", "--no-demo", "--evict-mib", "1", "--impls", *impls,
                                "--out", stem])
  with open(stem + ".json") as f:
    saved = json.load(f)
  assert saved["rows"] == rows and saved["meta"]["evict_mib"] == 1 == meta["evict_mib"]
  assert [r["impl"] for r in rows] == impls
  for r in rows:
    assert (r["batch"], r["kv_len"], r["rounds"]) == (2, 64, 2)
    assert math.isfinite(r["us"]) and r["us_min"] <= r["us"] <= r["us_max"]
    assert r["ratio"] > 0
  splits = {r["impl"]: r.get("num_kv_splits") for r in rows}
  # The XLA merge needs 2 splits for an LSE; the executor's own merge writes one at any count.
  assert splits["host"] >= 1 and splits["host-xla-merge"] == max(2, splits["host"])
  assert cpu_decode.table(stem + ".json").splitlines()[2].startswith("| 64 | ")
