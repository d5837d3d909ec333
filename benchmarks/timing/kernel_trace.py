"""Summaries of Mosaic GPU profiler traces: where a kernel's warpgroups spend their time.

The Mosaic GPU profiler (`CompilerParams(profile_space=..., profile_dir=...)`) writes a Chrome
trace per call: begin ("B") and end ("E") events of each named region (`jax.named_scope` in the
kernel body), one thread id per warpgroup of every CTA (`tid = 1 + warpgroup + warpgroups * cta`)
and "ts", whose unit is the trace's: jax 0.11-0.12's profiler stamps regions with the SM's
cycle counter (%clock) added to a globaltimer start and divides by 1000, so its durations are
thousands of SM cycles, not microseconds (benchmarks/mosaic_regions.py converts). `summarize`
turns that into, per warpgroup role and region, how often it was entered and how long it took,
in the trace's unit, plus the span of each CTA. Used by benchmarks/mosaic_regions.py.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics


@dataclasses.dataclass(frozen=True)
class RegionStats:
  count: int  # entries over all CTAs
  total: float  # in the trace's "ts" unit
  median: float  # of one entry
  share: float  # total / the role's summed CTA spans


def _pairs(events):
  """(tid, name, begin_ts, end_ts) of every closed region; nested regions are allowed."""
  open_regions = collections.defaultdict(list)
  for e in sorted(events, key=lambda e: (e["tid"], e["ts"], e["ph"] == "B")):
    if e["ph"] == "B":
      open_regions[(e["tid"], e["name"])].append(e["ts"])
    elif e["ph"] == "E":
      starts = open_regions[(e["tid"], e["name"])]
      if not starts:
        raise ValueError(f"trace: end of {e['name']!r} without a begin (tid {e['tid']})")
      yield e["tid"], e["name"], starts.pop(), e["ts"]


def summarize(trace: dict, warpgroups_per_cta: int, roles: dict[int, str]):
  """{role: {region: RegionStats}} and {role: median CTA span}, in the trace's unit.

  roles maps a warpgroup index within the CTA to a role name; warpgroups with the same role are
  pooled (the two consumers of a decode CTA, say)."""
  durations = collections.defaultdict(list)
  spans = collections.defaultdict(lambda: [float("inf"), float("-inf")])
  for tid, name, begin, end in _pairs(trace["traceEvents"]):
    wg = (tid - 1) % warpgroups_per_cta
    if wg not in roles:
      raise ValueError(f"trace: warpgroup {wg} has no role (roles: {sorted(roles)})")
    durations[(roles[wg], name)].append(end - begin)
    span = spans[tid]
    span[0], span[1] = min(span[0], begin), max(span[1], end)
  role_spans = collections.defaultdict(list)
  for tid, (lo, hi) in spans.items():
    role_spans[roles[(tid - 1) % warpgroups_per_cta]].append(hi - lo)
  out = collections.defaultdict(dict)
  for (role, name), ds in sorted(durations.items()):
    out[role][name] = RegionStats(count=len(ds), total=sum(ds),
                                  median=statistics.median(ds),
                                  share=sum(ds) / sum(role_spans[role]))
  return dict(out), {role: statistics.median(s) for role, s in role_spans.items()}
