"""The AMD aiter kernels (gfx950 code objects) and the host backend that runs their kernel
arguments on a CPU: primitives, plans, vmap rules, code objects. Mirrors csrc/."""
