"""kernel_trace.summarize, and mosaic_regions.py's summary in cycles of it, on synthetic Mosaic
GPU profiler traces with known region times."""


import pytest

import mosaic_regions
from timing import kernel_trace

ROLES = {0: "consumer", 1: "consumer", 2: "producer"}


def region(tid, name, begin, end):
  return [{"name": name, "ph": "B", "ts": begin, "tid": tid, "pid": 1},
          {"name": name, "ph": "E", "ts": end, "tid": tid, "pid": 1}]


def synthetic_trace(ctas=2, steps=3):
  """Consumers: per step wait 1, dequantize 2 (nested inside: load 0.5), qk 3; the producer
  issues for 4 per step. tids follow Mosaic's 1 + warpgroup + 3 * cta."""
  events = []
  for cta in range(ctas):
    for wg in range(3):
      tid = 1 + wg + 3 * cta
      t = 100.0 * cta
      for _ in range(steps):
        if wg == 2:
          events += region(tid, "issue", t, t + 4)
          t += 4
          continue
        events += region(tid, "wait", t, t + 1)
        events += region(tid, "dequantize", t + 1, t + 3)
        events += region(tid, "load", t + 1.5, t + 2)
        events += region(tid, "qk", t + 3, t + 6)
        t += 6
  return {"traceEvents": events[::-1]}  # order must not matter


def test_known_durations_and_shares():
  stats, spans = kernel_trace.summarize(synthetic_trace(), 3, ROLES)
  consumer = stats["consumer"]
  assert consumer["qk"].count == 2 * 2 * 3  # two consumers, two CTAs, three steps
  assert consumer["qk"].median == pytest.approx(3.0)
  assert consumer["dequantize"].median == pytest.approx(2.0)
  assert consumer["load"].median == pytest.approx(0.5)
  assert consumer["wait"].total == pytest.approx(12.0)
  assert consumer["qk"].share == pytest.approx(0.5)  # 3 of every 6 us
  assert stats["producer"]["issue"].share == pytest.approx(1.0)
  assert spans == {"consumer": pytest.approx(18.0), "producer": pytest.approx(12.0)}


def test_the_regions_script_reads_the_trace_in_cycles():
  """The profiler's "ts" are thousands of SM cycles: a region of 3 units is 3000 cycles."""
  roles = {0: "qk_softmax", 1: "pv", 2: "producer"}
  trace = synthetic_trace()
  for e in trace["traceEvents"]:
    if (e["tid"] - 1) % 3 == 1:
      e["name"] = "pv_" + e["name"]
  summary = mosaic_regions.summarize_cycles(trace)
  assert set(summary["regions"]) == set(roles.values())
  qk = summary["regions"]["qk_softmax"]["qk"]
  assert qk == dict(entries=2 * 3, median_cycles=3000, total_kcycles=18.0, share=0.5)
  assert summary["regions"]["pv"]["pv_load"]["median_cycles"] == 500
  assert summary["span_kcycles"] == {"qk_softmax": 18.0, "pv": 18.0, "producer": 12.0}
  text = mosaic_regions.format_cycles(summary)
  assert "| qk_softmax | qk | 6 | 3000 | 0.50 |" in text
  assert "median span of one producer warpgroup: 12.0 kcycles" in text


def test_the_profile_space_holds_every_region_of_a_split():
  """One split of K entries walks ceil(K / 64) blocks of REGIONS_PER_BLOCK regions each."""
  assert mosaic_regions.profile_space(2048) == 32 * 6 + 4
  assert mosaic_regions.profile_space(65) == 2 * 6 + 4


def test_unpaired_end_and_unknown_warpgroup_raise():
  with pytest.raises(ValueError, match="without a begin"):
    kernel_trace.summarize({"traceEvents": region(1, "qk", 0, 1)[1:]}, 3, ROLES)
  with pytest.raises(ValueError, match="no role"):
    kernel_trace.summarize({"traceEvents": region(3, "issue", 0, 1)}, 3, {0: "consumer"})


def test_the_profiled_build_gives_the_decode_the_profilers_settings():
  """Within profiled_build the Mosaic decode's CompilerParams carry the profile space and
  directory (with the decode's own settings); after it, the decode's are its own again."""
  from jax_mla._src.pallas.mosaic import decode as mosaic_decode
  settings = dict(profile_space=40, profile_dir="/tmp/regions")
  plgpu = lambda: mosaic_decode._plgpu()  # pylint: disable=protected-access
  with mosaic_regions.profiled_build(settings):
    params = plgpu().CompilerParams(approx_math=True)
    assert (params.profile_space, params.profile_dir, params.approx_math) == (
        40, "/tmp/regions", True)
    assert plgpu().Layout is not None  # the rest of the module passes through
  params = plgpu().CompilerParams(approx_math=True)
  assert (params.profile_space, params.profile_dir) == (0, "")
