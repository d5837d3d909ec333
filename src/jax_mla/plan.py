"""The split planner of the split-plus-merge path.

`num_kv_splits(num_seqs, num_heads, *, kv_len_hint=None, arch="gfx950")` picks the KV split count
from static ints only, so one compiled executable serves every set of KV lengths of a shape.
`LATENCY_MODEL_COEFFS` is the per-arch table of fitted latency-model coefficients (ships empty;
`benchmarks/gfx950_bench.py` fits it on hardware).
"""

from jax_mla._src.aiter.planner import LATENCY_MODEL_COEFFS, LatencyCoeffs, num_kv_splits

__all__ = ["LATENCY_MODEL_COEFFS", "LatencyCoeffs", "num_kv_splits"]
