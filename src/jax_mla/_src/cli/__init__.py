"""The `jax-mla` command line: demo and info."""
