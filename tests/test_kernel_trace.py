"""kernel_trace.summarize on synthetic Mosaic GPU profiler traces with known region times."""


import pytest

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
  assert consumer["qk"].median_us == pytest.approx(3.0)
  assert consumer["dequantize"].median_us == pytest.approx(2.0)
  assert consumer["load"].median_us == pytest.approx(0.5)
  assert consumer["wait"].total_us == pytest.approx(12.0)
  assert consumer["qk"].share == pytest.approx(0.5)  # 3 of every 6 us
  assert stats["producer"]["issue"].share == pytest.approx(1.0)
  assert spans == {"consumer": pytest.approx(18.0), "producer": pytest.approx(12.0)}
  text = kernel_trace.format_summary(stats, spans)
  assert "| consumer | qk | 12 | 3.000 | 36.0 | 0.50 |" in text


def test_unpaired_end_and_unknown_warpgroup_raise():
  with pytest.raises(ValueError, match="without a begin"):
    kernel_trace.summarize({"traceEvents": region(1, "qk", 0, 1)[1:]}, 3, ROLES)
  with pytest.raises(ValueError, match="no role"):
    kernel_trace.summarize({"traceEvents": region(3, "issue", 0, 1)}, 3, {0: "consumer"})
