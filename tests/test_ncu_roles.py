"""benchmarks/ncu_roles.py: an ncu source-page CSV split into the kernel's roles at their
setmaxnreg, each role's samples summed by stall reason (its input needs a GPU and ncu; here a
small CSV of the same form); and benchmarks/ncu_decode.py, the decode ncu profiles, here on
the reference backend."""

import csv
import gzip
import io

import ncu_roles

HEADER = ["Address", "Source", ncu_roles.SAMPLES, "stall_long_sb", "stall_selected",
          "stall_long_sb (Not Issued)"]
SASS = [  # (source, long_sb, selected): the preamble, then two roles
    ("LDC R1, c[0x0][0x28]", 0, 1),
    ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xd8", 0, 2),
    ("@!P2 BRA 0x7f00", 30, 0),
    ("HGMMA.64x64x16.F32.BF16 R152, gdesc[UR52], R152", 0, 10),
    ("USETMAXREG.DEALLOC.CTAPOOL 0x80", 0, 0),
    ("LDG.E.128.CONSTANT R28, desc[UR14][R14.64]", 5, 5),
]


def write_csv(path, compress=False):
  text = io.StringIO()
  writer = csv.writer(text)
  writer.writerow(["Kernel Name", "anonymous_mosaic_gpu_kernel"])
  writer.writerow(HEADER)
  for i, (source, long_sb, selected) in enumerate(SASS):
    # ncu writes counts with thousands separators
    writer.writerow([hex(i), source, f"{long_sb + selected:,}", long_sb, selected, 7])
  if compress:
    with gzip.open(path, "wt", newline="") as f:
      f.write(text.getvalue())
  else:
    path.write_text(text.getvalue())


def test_roles_split_at_setmaxnreg_and_sum_their_stalls(tmp_path):
  path = tmp_path / "k.csv"
  write_csv(path)
  split = ncu_roles.roles(ncu_roles.read_rows(str(path)))
  assert [label for label, _ in split] == ["prologue", "setmaxnreg 216", "setmaxnreg 128"]
  assert [len(rows) for _, rows in split] == [1, 3, 2]
  shares = ncu_roles.stall_shares(split[1][1])  # 42 samples: 30 waiting, 12 issuing
  assert shares == {"long_sb": 30 / 42, "selected": 12 / 42}  # "Not Issued" columns left out
  text = ncu_roles.summary(ncu_roles.read_rows(str(path)))
  assert "setmaxnreg 216: 42 samples (79% of the kernel's); long_sb 71%, selected 29%" in text
  assert "setmaxnreg 128: 10 samples (19% of the kernel's); long_sb 50%, selected 50%" in text


def test_retry_loops_after_the_last_exit_and_unsampled_roles_are_named(tmp_path):
  """The rows after the listing's last EXIT are a range of their own, and a role that executed
  instructions without a sample is reported as such rather than left out."""
  text = io.StringIO()
  writer = csv.writer(text)
  writer.writerow(["Kernel Name", "anonymous_mosaic_gpu_kernel"])
  writer.writerow(HEADER + [ncu_roles.EXECUTED])
  for i, (source, samples, executed) in enumerate([
      ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xc0", 0, 4), ("HGMMA.64x64x16.F32.BF16 R1", 6, 8),
      ("EXIT", 0, 4), ("USETMAXREG.DEALLOC.CTAPOOL 0x98", 0, 4),
      ("LDG.E.128.CONSTANT R28, desc[UR14][R14.64]", 0, "1,200"), ("EXIT", 0, 4),
      ("@!P1 NANOSLEEP.SYNCS 0x989680", 9, 30), ("@!P1 BRA 0x7f00", 1, 30)]):
    writer.writerow([hex(i), source, samples, samples, 0, 0, executed])
  path = tmp_path / "e.csv"
  path.write_text(text.getvalue())
  rows = ncu_roles.read_rows(str(path))
  split = ncu_roles.roles(rows)
  assert [(label, len(part)) for label, part in split] == [
      ("prologue", 0), ("setmaxnreg 192", 3), ("setmaxnreg 152", 3),
      (ncu_roles.AFTER_EXIT, 2)]
  summary = ncu_roles.summary(rows)
  assert ("setmaxnreg 152: no samples, though it executed 1208 warp instructions" in summary)
  assert f"{ncu_roles.AFTER_EXIT}: 10 samples (62% of the kernel's)" in summary


def test_shared_wavefronts_by_opcode_without_predicates_or_modifiers(tmp_path):
  path = tmp_path / "w.csv"
  rows = [("HGMMA.64x64x16.F32.BF16 R152, gdesc[UR4], R152", "1,024", "8,192"),
          ("@!P1 STS.128 [R8], R64", "10", "40"), ("STS.64 [R9], R2", "2", "2"),
          ("LDG.E.128.CONSTANT R28, desc[UR14][R14.64]", "99", "0"),
          ("HGMMA.64x256x16.F32.BF16 R24, gdesc[UR16].tnspB, R24", "4", "72")]
  text = io.StringIO()
  writer = csv.writer(text)
  writer.writerow(["Kernel Name", "anonymous_mosaic_gpu_kernel"])
  writer.writerow(["Address", "Source", ncu_roles.SAMPLES, ncu_roles.EXECUTED, ncu_roles.SHARED])
  for i, (source, executed, waves) in enumerate(rows):
    writer.writerow([hex(i), source, "0", executed, waves])
  path.write_text(text.getvalue())
  table = ncu_roles.shared_wavefronts(ncu_roles.read_rows(str(path)))
  assert table == [("HGMMA.64x64x16.F32.BF16", 8192, 8.0),
                   ("HGMMA.64x256x16.F32.BF16", 72, 18.0), ("STS", 42, 42 / 12)]
  text = ncu_roles.shared_summary(ncu_roles.read_rows(str(path)))
  assert text.splitlines()[0] == "shared-memory wavefronts: 8306"
  assert "98.6%  HGMMA.64x64x16.F32.BF16: 8192 (8.0 a warp instruction)" in text


def test_reads_a_gzipped_report(tmp_path):
  plain, packed = tmp_path / "k.csv", tmp_path / "k.csv.gz"
  write_csv(plain)
  write_csv(packed, compress=True)
  assert ncu_roles.read_rows(str(packed)) == ncu_roles.read_rows(str(plain))


def test_ncu_decode_runs_the_public_decode_on_the_timed_runs_data():
  import numpy as np  # pylint: disable=import-outside-toplevel
  import pytest  # pylint: disable=import-outside-toplevel
  import ncu_decode  # pylint: disable=import-outside-toplevel
  out = np.asarray(ncu_decode.main(["16", "1", "2", "64", "--backend", "reference"]),
                   np.float32)
  assert out.shape == (2, 16, 512) and np.isfinite(out).all() and np.abs(out).max() > 0
  with pytest.raises(SystemExit):
    ncu_decode.main(["16", "1", "2", "64", "--calls", "0"])
