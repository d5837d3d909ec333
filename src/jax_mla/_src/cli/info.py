"""`python -m jax_mla info`: platform, devices, code objects, and what backend="auto" picks."""

from __future__ import annotations

import argparse

import jax

from jax_mla._src import backends, platform


def run(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m jax_mla info", description=__doc__)
  parser.parse_args(argv)
  print(f"jax {jax.__version__}, default platform: {jax.default_backend()}")
  for device in jax.devices():
    arch = platform.device_arch(device)
    print(f"  device {device.id}: {device.platform} {getattr(device, 'device_kind', '')}"
          f"{f' ({arch})' if arch else ''}")
  ok, why = backends.host_available()
  print(f"host backend: {'available' if ok else 'unavailable'} ({why})")
  from jax_mla._src.pallas import backend as pallas_backend  # pylint: disable=import-outside-toplevel
  kernel, why = pallas_backend.kernel_for(jax.devices()[0])
  print(f"pallas backend: "
        f"{'the ' + kernel + ' kernel' if kernel else 'unavailable'} ({why})")
  print("code objects:")
  try:
    from jax_mla._src.aiter.code_objects import find as code_objects  # pylint: disable=import-outside-toplevel
    for discovery in code_objects.discover_all():
      print(f"  {discovery.describe()}")
  except ImportError as e:
    print(f"  (code-object discovery unavailable: {e})")
  chosen, reason = backends.explain_auto()
  print(f"backend='auto' picks: {chosen} ({reason})")
  print("head counts served by padding: 8 heads run as 16 (sink padded with -inf, output "
        "sliced)")
  return 0
