"""The benchmarks' timing library (not part of jax_mla).

- call_loop: the timed loop of decode calls (indices moved every call, outputs carried).
- device_time: GPU busy time of a call from a profiler trace, in total and by kernel.
- kernel_trace: summaries of Mosaic GPU profiler traces (time per warpgroup role and region).
- timing_stats: medians of two sets of timings and a two-sided significance test.
- latency_fit: the split planner's latency model fitted to measured times, and its table file.

Scripts run as `python benchmarks/NAME.py` have benchmarks/ as sys.path[0], so they import
`from timing import device_time`; pytest puts benchmarks/ on the path (pyproject.toml).
"""
