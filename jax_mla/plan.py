"""Planning helpers of the split-plus-merge path (public)."""

from jax_mla._src.planner import LATENCY_MODEL_COEFFS, LatencyCoeffs, num_kv_splits

__all__ = ["LATENCY_MODEL_COEFFS", "LatencyCoeffs", "num_kv_splits"]
