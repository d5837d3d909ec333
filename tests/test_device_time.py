"""benchmarks/timing/device_time.py on CPU: the GPU busy time of a synthetic trace (the union of
the stream lines' intervals, derived lines ignored), and the error where a trace has no GPU."""

import gzip
import json

import pytest

from timing import device_time


def meta(pid, tid, process, thread):
  return [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": process}},
          {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": thread}}]


def span(pid, tid, ts, dur):
  return {"ph": "X", "name": "k", "pid": pid, "tid": tid, "ts": ts, "dur": dur}


def test_busy_time_is_the_union_of_the_stream_lines_intervals():
  events = (meta(1, 10, "/device:GPU:0", "Stream #13(compute)")
            + meta(1, 11, "/device:GPU:0", "Stream #14(copy)")
            + meta(1, 12, "/device:GPU:0", "XLA Modules")
            + meta(2, 20, "/host:CPU", "python")
            + [span(1, 10, 100, 10),     # 100..110
               span(1, 11, 105, 10),     # 105..115: overlaps, counts once
               span(1, 10, 112, 2),      # inside the previous one
               span(1, 10, 200, 5.5),    # after a gap that does not count
               span(1, 12, 0, 1000),     # a derived line spanning everything: ignored
               span(2, 20, 0, 1000)])    # host work: ignored
  assert device_time.busy_us(events) == pytest.approx(15 + 5.5)


def test_a_trace_without_a_gpu_stream_says_so():
  events = meta(2, 20, "/host:CPU", "python") + [span(2, 20, 0, 10)]
  with pytest.raises(ValueError, match="no device stream lines.*needs a GPU"):
    device_time.busy_us(events)


def test_load_trace_reads_the_perfetto_file(tmp_path):
  events = meta(1, 10, "/device:GPU:0", "Stream #1") + [span(1, 10, 0, 3)]
  path = tmp_path / "plugins" / "profile" / "run"
  path.mkdir(parents=True)
  with gzip.open(path / "perfetto_trace.json.gz", "wt") as f:
    json.dump({"traceEvents": events}, f)
  assert device_time.busy_us(device_time.load_trace(tmp_path)) == 3


def test_device_time_on_the_cpu_raises_rather_than_reporting_host_time():
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  f = jax.jit(lambda x: jnp.sin(x).sum())
  x = jnp.ones((256,))
  with pytest.raises(ValueError, match="no device stream lines"):
    device_time.device_time_us(lambda: jax.block_until_ready(f(x)), calls=1)


def test_kernel_us_sums_each_kernel_over_the_stream_lines_only():
  events = (meta(1, 10, "/device:GPU:0", "Stream #13(compute)")
            + meta(1, 12, "/device:GPU:0", "XLA Ops")
            + [dict(span(1, 10, 0, 2), name="gather"), dict(span(1, 10, 5, 3), name="gather"),
               dict(span(1, 10, 9, 1), name="merge"), dict(span(1, 12, 0, 50), name="gather")])
  assert device_time.kernel_us(events) == {"gather": 5, "merge": 1}


def test_torch_busy_time_is_the_union_of_its_gpu_events():
  """The measure for a PyTorch library timed beside jax_mla (benchmarks/vs_flashmla.py): GPU
  kernels, copies and memsets count once where they overlap; host events never."""
  events = [
      {"ph": "X", "cat": "kernel", "ts": 0, "dur": 10},
      {"ph": "X", "cat": "kernel", "ts": 5, "dur": 10},  # overlaps: 0..15
      {"ph": "X", "cat": "gpu_memcpy", "ts": 20, "dur": 2},
      {"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 100},  # host side: not GPU time
      {"ph": "X", "cat": "gpu_memset", "ts": 21, "dur": 4},  # 20..25
  ]
  assert device_time.torch_busy_us(events) == 20.0
