"""Device time of a call from a profiler trace (gpu_decode.py --timing profiler).

The host clock around a jitted loop of decode calls also counts what the GPU waits for between
the loop's iterations (on the H200, 13-25 us per iteration even for an index update alone), so
at small shapes every implementation's number is mostly that wait. This module runs the call
under `jax.profiler.trace` and measures the time in which the GPU's streams ran anything
(kernels, copies): the union of the intervals of the events on the device's stream lines, so
work on two streams at once counts once, and gaps between launches do not count.

Only stream lines count: the trace's derived lines ("XLA Modules", "XLA Ops") span whole
modules, idle time included. The process and line names ("/device:GPU:0", "Stream #...") are
those of XLA's GPU traces on the H200 with jax 0.11.2 (2026-12-03); where a trace has no such
lines the error lists the ones it has. `kernel_us` splits the same events by kernel name, to say
where a call's device time goes (gpu_decode.py --kernels).
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import tempfile

DEVICE_PREFIX = "/device:"
STREAM_PREFIX = "Stream"


def _names(events, kind):
  """{pid: name} for process_name metadata, {(pid, tid): name} for thread_name."""
  meta = [e for e in events if e.get("ph") == "M" and e.get("name") == kind]
  if kind == "process_name":
    return {e["pid"]: e["args"]["name"] for e in meta}
  return {(e["pid"], e["tid"]): e["args"]["name"] for e in meta}


def _stream_lines(events):
  """The (pid, tid) of the device stream lines. Raises ValueError when there are none."""
  processes = _names(events, "process_name")
  threads = _names(events, "thread_name")
  lines = {key for key, name in threads.items()
           if processes.get(key[0], "").startswith(DEVICE_PREFIX)
           and name.startswith(STREAM_PREFIX)}
  if not lines:
    device_lines = sorted({name for key, name in threads.items()
                           if processes.get(key[0], "").startswith(DEVICE_PREFIX)})
    raise ValueError("the trace has no device stream lines (processes: "
                     f"{sorted(set(processes.values()))}; device lines: {device_lines}); "
                     "--timing profiler needs a GPU")
  return lines


def busy_us(events) -> float:
  """Microseconds in which any device stream line of a Chrome/Perfetto trace ran an event
  (the union of their intervals). Raises ValueError when the trace has no device stream."""
  lines = _stream_lines(events)
  return union_us((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in events
                  if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in lines)


# The GPU event categories of a torch.profiler Chrome trace (kineto).
TORCH_GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def torch_busy_us(events) -> float:
  """busy_us for a torch.profiler Chrome trace: the union of its GPU events' intervals (the
  same measure, for timing a PyTorch library side by side, benchmarks/vs_flashmla.py)."""
  return union_us((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in events
                  if e.get("ph") == "X" and e.get("cat") in TORCH_GPU_CATEGORIES)


def union_us(spans) -> float:
  """The length of the union of (start, end) intervals."""
  total, end = 0.0, float("-inf")
  for lo, hi in sorted(spans):
    if hi <= end:
      continue
    total += hi - max(lo, end)
    end = hi
  return total


def kernel_us(events) -> dict:
  """{event name: summed microseconds} over the device stream lines (kernels and copies;
  overlapping events each count in full here)."""
  lines = _stream_lines(events)
  total = {}
  for e in events:
    if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in lines:
      total[e["name"]] = total.get(e["name"], 0.0) + float(e.get("dur", 0.0))
  return total


def load_trace(directory) -> list:
  """The events of the Perfetto trace jax.profiler wrote under `directory`."""
  paths = glob.glob(os.path.join(directory, "**", "perfetto_trace.json.gz"), recursive=True)
  if len(paths) != 1:
    raise ValueError(f"expected one perfetto_trace.json.gz under {directory}, found {paths}")
  with gzip.open(paths[0]) as f:
    data = json.load(f)
  return data["traceEvents"] if isinstance(data, dict) else data


def device_time_us(run, calls: int) -> float:
  """Device busy time of run() (which must block until its work is done) per call, for a
  run() that makes `calls` calls."""
  return device_profile(run, calls)[0]


def device_profile(run, calls: int):
  """(busy microseconds per call, {kernel name: microseconds per call}) of run()."""
  import jax  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as directory:
    with jax.profiler.trace(directory, create_perfetto_trace=True):
      run()
    events = load_trace(directory)
  return (busy_us(events) / calls,
          {name: us / calls for name, us in kernel_us(events).items()})
