"""backend="pallas": Pallas GPU kernels (Mosaic GPU on Hopper, Triton elsewhere), their plan
and their split merge."""
