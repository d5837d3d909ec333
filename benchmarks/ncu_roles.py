"""Where each warpgroup role of the Mosaic kernel stalls, from Nsight Compute's per-instruction
warp-state samples.

The kernel's roles run disjoint code, and each begins with its `setmaxnreg` (the SASS
`USETMAXREG`, `mosaic.kernel.REGISTERS`: paired 216 for warpgroup 0, 160 for warpgroup 1, 128 for
the producer; unpaired 192 / 160 / 152). So the SASS listing, split at those instructions, gives
each role's samples: its share of issue ("selected") and of each stall reason, and the
instructions it waits at most. The out-of-line barrier retry loops ptxas puts after the
listing's last `EXIT` are a range of their own (any role may wait there: at the unpaired shapes
they held 17% of the samples). A role that executed instructions but holds no samples is named
as such, not left out: ncu's page then does not say where it waited (the producer of the
16 x 4, B 32, K 512 profile of 2026-12-07, 1.2 M warp instructions and no samples).

Input: the source page of an `ncu --set full --import-source yes` report as CSV:
  ncu --set full --import-source yes -k regex:mosaic --launch-skip 1 --launch-count 1 \\
      -o REPORT python benchmarks/ncu_decode.py 128 1 128 2048   # one launch of the decode
  ncu -i REPORT.ncu-rep --page source --csv --print-source sass > FILE.csv
Usage (anywhere; FILE may be gzipped):
  python benchmarks/ncu_roles.py FILE.csv[.gz] [--top 6] [--shared]

--shared adds the shared-memory wavefronts (128 bytes each) by opcode, from the same page:
what each kind of instruction moves through the SM's shared-memory data path, the wgmma's
operand reads included (benchmarks/README.md, "What limits it now"). The bulk copies' reads
and the bytes a peer CTA's copies write here are not counted there.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import re

SAMPLES = "Warp Stall Sampling (All Samples)"
SHARED = "L1 Wavefronts Shared"
EXECUTED = "Instructions Executed"
ROLE_START = re.compile(r"USETMAXREG\.\S+ (?:\S+, )?(0x[0-9a-f]+)")


def read_rows(path):
  """The report's SASS rows as dicts (the CSV's second line is its header)."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", newline="") as f:
    lines = f.read().splitlines()
  return list(csv.DictReader(io.StringIO("\n".join(lines[1:]))))


def _count(text):
  text = (text or "").replace(",", "")
  return int(float(text)) if text else 0


def _source(row):
  return " ".join(row["Source"].split())


def _stall_keys(row):
  """The row's stall-reason columns over all samples (not the "Not Issued" ones)."""
  return [k for k in row if k.startswith("stall_") and "Not Issued" not in k]


def split_at_setmaxnreg(items, text=lambda item: item):
  """[(register count or None, [item, ...])]: the items of a SASS listing (text(item) is its
  instruction) before the first USETMAXREG (None), then one range per USETMAXREG, each
  opening its range, labelled by the count it sets, in program order."""
  split = [(None, [])]
  for item in items:
    match = ROLE_START.search(text(item))
    if match:
      split.append((int(match.group(1), 16), []))
    split[-1][1].append(item)
  return split


AFTER_EXIT = "after the last EXIT (out-of-line waits)"


def roles(rows):
  """[(label, [row, ...])]: 'prologue', then one range per setmaxnreg (labelled by its register
  count), in program order, and AFTER_EXIT for the rows after the listing's last EXIT."""
  exits = [i for i, row in enumerate(rows) if opcode(row) == "EXIT"]
  body, tail = (rows[:exits[-1] + 1], rows[exits[-1] + 1:]) if exits else (rows, [])
  split = [("prologue" if count is None else f"setmaxnreg {count}", part)
           for count, part in split_at_setmaxnreg(body, _source)]
  return split + ([(AFTER_EXIT, tail)] if tail else [])


def stall_shares(rows):
  """{reason: its share of the rows' samples} (issue is 'selected')."""
  total = sum(_count(r[SAMPLES]) for r in rows)
  reasons = {key[len("stall_"):]: sum(_count(r[key]) for r in rows) / max(total, 1)
             for key in (_stall_keys(rows[0]) if rows else ())}
  return dict(sorted(reasons.items(), key=lambda kv: -kv[1]))


def summary(rows, top=6):
  """One text block per role: its share of all samples, its stall shares, its top waits."""
  everything = sum(_count(r[SAMPLES]) for r in rows)
  out = []
  for label, part in roles(rows):
    samples = sum(_count(r[SAMPLES]) for r in part)
    if not samples:
      executed = sum(_count(r.get(EXECUTED)) for r in part)
      if executed and label != AFTER_EXIT:  # a role, not the retry loops it may jump to
        out.append(f"{label}: no samples, though it executed {executed} warp instructions "
                   "(this page does not say where it waited)")
      continue
    shares = stall_shares(part)
    out.append(f"{label}: {samples} samples ({samples / everything:.0%} of the kernel's); "
               + ", ".join(f"{k} {v:.0%}" for k, v in list(shares.items())[:6] if v))
    hot = sorted(part, key=lambda r: -_count(r[SAMPLES]))[:top]
    for r in hot:
      reason = max(_stall_keys(r), key=lambda k: _count(r[k]))
      out.append(f"    {_count(r[SAMPLES]) / samples:5.1%}  {_source(r)[:56]}"
                 f"  ({reason[len('stall_'):]})")
  return "\n".join(out)


def opcode(row):
  """The row's SASS opcode without its predicate and modifiers; HGMMA keeps its shape."""
  words = _source(row).split()
  if words and words[0].startswith("@"):
    words = words[1:]
  op = words[0] if words else ""
  return op if op.startswith("HGMMA") else op.split(".")[0]


def shared_wavefronts(rows):
  """[(opcode, its shared-memory wavefronts, per warp-level instruction executed)], largest
  first, over the rows that move any."""
  totals, executed = {}, {}
  for row in rows:
    waves = _count(row.get(SHARED))
    if waves:
      op = opcode(row)
      totals[op] = totals.get(op, 0) + waves
      executed[op] = executed.get(op, 0) + _count(row.get(EXECUTED))
  return [(op, waves, waves / max(executed[op], 1))
          for op, waves in sorted(totals.items(), key=lambda kv: -kv[1])]


def shared_summary(rows):
  table = shared_wavefronts(rows)
  total = sum(waves for _, waves, _ in table)
  return "\n".join([f"shared-memory wavefronts: {total}"] + [
      f"    {waves / total:5.1%}  {op}: {waves} ({per:.1f} a warp instruction)"
      for op, waves, per in table])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("csv")
  parser.add_argument("--top", type=int, default=6)
  parser.add_argument("--shared", action="store_true")
  args = parser.parse_args(argv)
  rows = read_rows(args.csv)
  print(summary(rows, args.top))
  if args.shared:
    print(shared_summary(rows))


if __name__ == "__main__":
  main()
