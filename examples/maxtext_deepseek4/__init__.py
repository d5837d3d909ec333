"""MaxText 0.2.5's DeepSeek-V4 attention decoding through jax_mla (docs/maxtext.md).

- `cache`: the caches in jax_mla's layout and a step's two index lists (no MaxText needed);
- `decoder.JaxMlaV4Decoder`: the integration, a MaxText `CompressedAttention` layer decoding with
  `jax_mla.decode` (needs the `maxtext` extra; MaxText itself installs with `--no-deps`);
- `model`: MaxText configs and layers at V4's attention shape (tiny and real);
- `h200_real_shape.py`: the real layer shape on a GPU, error and timing.
"""
