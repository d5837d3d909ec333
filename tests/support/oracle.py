"""An independent float64 NumPy oracle for the packed row format and for decode.

Written from KERNELS.md sections 1-2 without any jax_mla code: the e4m3fn and e8m0 decoders are
bit-level, so a library bug in either cannot hide behind a shared helper.
"""

from __future__ import annotations

import math

import numpy as np


def e4m3fn_to_f64(byte: np.ndarray) -> np.ndarray:
  """OCP fp8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is NaN; no inf."""
  b = np.asarray(byte, np.uint8).astype(np.int64)
  sign = np.where(b & 0x80, -1.0, 1.0)
  exponent = (b >> 3) & 0xF
  mantissa = b & 0x7
  normal = (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0)
  subnormal = (mantissa / 8.0) * 2.0**-6
  value = sign * np.where(exponent == 0, subnormal, normal)
  return np.where((exponent == 0xF) & (mantissa == 0x7), np.nan, value)


def e8m0_to_f64(byte: np.ndarray) -> np.ndarray:
  """e8m0: 2^(b - 127); 0xFF is NaN."""
  b = np.asarray(byte, np.uint8).astype(np.float64)
  return np.where(b == 255, np.nan, np.exp2(b - 127.0))


def bf16_to_f64(x) -> np.ndarray:
  """bf16 (an ml_dtypes array or its uint16 bits) to float64, through the bit pattern."""
  x = np.asarray(x)
  bits = x.view(np.uint16) if x.dtype.itemsize == 2 else x.astype(np.uint16)
  return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def dequantize_rows(packed: np.ndarray, rope) -> np.ndarray:
  """Packed rows uint8 [..., 512] + rope bf16 [..., 64] -> float64 [..., 512]."""
  packed = np.asarray(packed, np.uint8)
  values = e4m3fn_to_f64(packed[..., :448]).reshape(*packed.shape[:-1], 7, 64)
  scales = e8m0_to_f64(packed[..., 448:462:2])
  nope = (values * scales[..., None]).reshape(*packed.shape[:-1], 448)
  return np.concatenate([nope, bf16_to_f64(rope)], axis=-1)


def oracle_decode(q_packed, q_rope, kv_packed, kv_rope, kv_indptr, kv_indices, sink,
                  tokens_per_seq: int = 1):
  """Decode of packed rows in float64 at the kernels' scale 1/sqrt(512). Returns (out [T, H, 512],
  lse [T, H]), lse with the sink included.

  sink: None or [H]; -inf means no sink. A sequence without KV entries gives out 0, lse = sink.
  """
  queries = dequantize_rows(q_packed, q_rope)  # [T, H, 512]
  keys = token_keys(dequantize_rows(kv_packed, kv_rope), kv_indptr, kv_indices, queries.shape[0],
                    tokens_per_seq)
  return oracle_attend(queries, keys, sink, 1.0 / math.sqrt(512.0))


def oracle_attend(queries, token_keys, sink, scale: float):
  """Decode in float64 from values: queries [T, H, 512], token_keys[t] the [K_t, 512] keys query
  token t attends to, sink None or [H] (-inf: none). Returns (out [T, H, 512], lse [T, H])."""
  queries = np.asarray(queries, np.float64)
  num_tokens, num_heads = queries.shape[:2]
  sink = (np.full(num_heads, -np.inf) if sink is None
          else np.asarray(sink, np.float64).reshape(num_heads))
  out = np.zeros((num_tokens, num_heads, 512))
  lse = np.zeros((num_tokens, num_heads))
  for t in range(num_tokens):
    keys = np.asarray(token_keys[t], np.float64).reshape(-1, 512)
    scores = queries[t] @ keys.T * scale
    for h in range(num_heads):
      s, sk = scores[h], sink[h]
      if sk == np.inf:
        out[t, h], lse[t, h] = 0.0, np.inf
        continue
      m = max(np.max(s, initial=-np.inf), sk)
      if m == -np.inf:
        out[t, h], lse[t, h] = 0.0, -np.inf
        continue
      w = np.exp(s - m)
      denom = w.sum() + math.exp(sk - m)
      out[t, h] = (w @ keys) / denom if len(keys) else 0.0
      lse[t, h] = m + math.log(denom)
  return out, lse


def token_keys(pool_values, kv_indptr, kv_indices, num_tokens: int, tokens_per_seq: int):
  """Each query token's keys [K_t, 512] from a pool of values [R, 512] and ragged lists, shared
  by a sequence's tokens (len(kv_indptr) = num_seqs + 1) or one per token (num_tokens + 1)."""
  kv_indptr = np.asarray(kv_indptr, np.int64)
  kv_indices = np.asarray(kv_indices, np.int64)
  per_token = len(kv_indptr) - 1 == num_tokens
  lists = [kv_indices[kv_indptr[i]:kv_indptr[i + 1]] for i in range(len(kv_indptr) - 1)]
  return [np.asarray(pool_values)[lists[t if per_token else t // tokens_per_seq]]
          for t in range(num_tokens)]
