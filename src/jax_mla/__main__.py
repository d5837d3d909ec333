"""Command line: `python -m jax_mla demo [...]` and `python -m jax_mla info`."""

from __future__ import annotations

import sys


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  commands = {"demo": "run a synthetic DeepSeek-V4 decode and compare it with the reference",
              "info": "platform, devices, code objects, and what backend='auto' picks"}
  if not argv or argv[0] not in commands:
    print("usage: python -m jax_mla {demo,info} [options]\n")
    for name, text in commands.items():
      print(f"  {name:6s} {text}")
    return 0 if argv[:1] in (["-h"], ["--help"]) else 2
  if argv[0] == "demo":
    from jax_mla._src.cli import demo  # pylint: disable=import-outside-toplevel
    return demo.run(argv[1:])
  from jax_mla._src.cli import info  # pylint: disable=import-outside-toplevel
  return info.run(argv[1:])


if __name__ == "__main__":
  sys.exit(main())
