"""benchmarks/vs_flashmla.py's suites (its timing needs a GPU and FlashMLA): "flash" and
"others" split "all" exactly, so a run cut by a time limit can be completed by the other;
`--shape` lists split the same way; and the README's tables of its runs, and benchmarks/README's
table of every FlashMLA run, are the results files they name."""

import argparse
import json
import pathlib
import re
import subprocess
import sys

import pytest

import vs_flashmla
from timing import call_loop


def test_flash_and_others_are_the_two_halves_of_all():
  flash, others = vs_flashmla.shapes("all")
  assert len(flash) == 30 and all(t == 1 and h in (64, 128) for h, t, _, _ in flash)
  assert vs_flashmla.shapes("flash") == (flash, [])
  assert vs_flashmla.shapes("others") == ([], others)
  assert {(h, t) for h, t, _, _ in others} == set(vs_flashmla.OTHER_LAYOUTS)
  assert all(b >= 32 for _, _, b, _ in others)


def test_unknown_suite_is_refused():
  with pytest.raises(KeyError):
    vs_flashmla.shapes("everything")


def test_given_shapes_split_as_the_suites_do():
  """A --shape list goes to FlashMLA where it serves the shape and to plain XLA elsewhere, in
  the order given: the suite's own shapes split back into its halves (the FlashMLA child gets
  its shapes this way)."""
  flash, others = vs_flashmla.shapes("all")
  assert vs_flashmla.given_shapes(others[::-1] + flash) == (flash, others[::-1])
  assert vs_flashmla.given_shapes([(32, 1, 32, 512), (128, 2, 8, 512), (64, 1, 1, 64)]) == (
      [(64, 1, 1, 64)], [(32, 1, 32, 512), (128, 2, 8, 512)])


@pytest.mark.parametrize("text", ["128,1,64", "128,1,64,2048,1", "128,1,0,2048", "a,1,2,3",
                                  "128 1 64 2048", ""])
def test_malformed_shapes_are_refused(text):
  with pytest.raises(argparse.ArgumentTypeError, match="HEADS,TOKENS,BATCH,K"):
    vs_flashmla.parse_shape(text)


def test_shape_parses():
  assert vs_flashmla.parse_shape("16,4,32,512") == (16, 4, 32, 512)


def test_shapes_and_a_suite_are_not_both_taken():
  done = subprocess.run([sys.executable, vs_flashmla.__file__, "--suite", "flash", "--shape",
                         "128,1,8,512"], capture_output=True, text=True, check=False)
  assert done.returncode == 2 and "not allowed with argument --suite" in done.stderr


def test_the_timed_loop_runs_the_public_decode_with_changing_indices():
  """The loop both vs_flashmla.py and mosaic_ab.py time (here through the reference backend):
  STEPS decodes of the shape's problem, each at indices moved on by STRIDE, each output the
  loop's carry: it returns the last call's output (to a bf16 rounding: XLA fuses the call
  differently inside the loop), and not the one before."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import jax_mla
  rng = np.random.default_rng(0)
  pool = jnp.asarray(rng.standard_normal((vs_flashmla.POOL, 512)).astype(np.float32))
  kv, kv_rope = jax_mla.pack_rows(pool)
  args = vs_flashmla.call_args((16, 1, 2, 64))
  np.testing.assert_array_equal(np.asarray(args[4]), [0, 64, 128])
  call = jax.jit(vs_flashmla.decode_call(kv, kv_rope, 1, "reference"))
  got = np.asarray(vs_flashmla.looped(call)(*args), np.float32)
  assert got.shape == (2, 16, 512) and np.isfinite(got).all()
  moved = lambda i: (args[2] + i * call_loop.STRIDE) & (vs_flashmla.POOL - 1)
  last = np.asarray(call(*args[:2], moved(vs_flashmla.STEPS - 1), *args[3:]), np.float32)
  one_rounding = lambda a, b: np.all(np.abs(a - b) <= 2.0**-8 * np.abs(b) + 1e-6)
  assert one_rounding(got, last)
  before = np.asarray(call(*args[:2], moved(vs_flashmla.STEPS - 2), *args[3:]), np.float32)
  assert not one_rounding(got, before)
  update = np.asarray(vs_flashmla.looped(vs_flashmla.index_update)(*args))
  np.testing.assert_array_equal(update, np.asarray(moved(vs_flashmla.STEPS - 1)))


# --- the README's tables are the results files they name ----------------------------------------

ROOT = pathlib.Path(__file__).resolve().parents[1]


def readme_section(heading):
  """The README's paragraphs from the bold `heading` to the next bold or section heading, as
  `text` (for the table rows) and with whitespace collapsed as `prose`."""
  text = (ROOT / "README.md").read_text()
  start = text.index(heading)
  end = min(i for i in (text.find("\n**", start + 1), text.find("\n#", start)) if i > 0)
  return text[start:end], " ".join(text[start:end].split())


def results_rows(section, suffix):
  """The rows of the first results file `section` names ending in `suffix` (the latest run)."""
  path = re.search(r"`(benchmarks/results/[^`]+" + re.escape(suffix) + ")`", section).group(1)
  return json.loads((ROOT / path).read_text())["rows"]


def test_readme_flashmla_table_is_its_results_file():
  text, prose = readme_section("**Against FlashMLA, side by side.**")
  rows = results_rows(text, "_flash.json")
  ratio = {(r["heads"], r["batch"], r["k"]): r["flashmla_over_jax_mla"] for r in rows}
  table = re.findall(r"^\| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", text, re.M)
  assert len(table) == len(ratio) // 3 == 10
  for heads, batch, *cells in table:
    for k, cell in zip((512, 1024, 2048), cells):
      assert cell == f"{ratio[int(heads), int(batch), k]:.2f}", (heads, batch, k)
  above, geomean = vs_flashmla.summary(list(ratio.values()))
  assert f"{above} of {len(ratio)} shapes at or above 1.0, geometric mean {geomean:.3f}" in prose


def test_readme_plain_xla_table_is_its_results_file():
  text, _ = readme_section("**Against plain XLA.**")
  rows = {(r["heads"], r["tokens_per_seq"], r["batch"], r["k"]): r
          for r in results_rows(text, "_others.json")}
  table = re.findall(r"^\| (\d+) x (\d+) \| (\d+) \| ([\d.]+) \(([\d.]+)(?: us)?\) \| "
                     r"([\d.]+) \(([\d.]+)(?: us)?\) \|$", text, re.M)
  assert len(table) * 2 == len(rows) == 12
  for heads, tokens, batch, *cells in table:
    for k, (over, us) in zip((512, 2048), (cells[:2], cells[2:])):
      row = rows[int(heads), int(tokens), int(batch), k]
      assert (over, us) == (f"{row['jax_mla_over_plain']:.2f}", f"{row['jax_mla_us']:.1f}")


def test_benchmarks_readme_runs_are_their_results_files():
  """benchmarks/README.md's table of every FlashMLA run: each row's figures are its file's."""
  text = (ROOT / "benchmarks" / "README.md").read_text()
  section = text[text.index("**Where it stands.**"):text.index("**What limits it now.**")]
  table = re.findall(r"^\| (\d+) \| (H\d00), (\S+) \| `([^`]+)` \| (\d+) \| ([\d.]+) \| "
                     r"([\d.]+) \((\d+)\) against ([\d.]+) \| (\d+) heads B (\d+) K (\d+): "
                     r"([\d.]+) \| [^|]+ \|$", section, re.M)
  files = sorted((ROOT / "benchmarks" / "results").glob("*/vs_flashmla*.json"))
  flash_runs = [f for f in files if "others" not in f.name]
  assert len(table) == len(flash_runs) == 12, "a row per run that timed FlashMLA"
  for run, gpu, date, name, above, geomean, us, tflops, flash_us, *closest in table:
    data = json.loads((ROOT / "benchmarks" / "results" / name).read_text())
    assert data["meta"]["device"].startswith(f"NVIDIA {gpu}") and data["meta"]["date"][:10] == date
    assert re.search(rf"run{run}\D", name) or run == "1", (run, name)
    rows = [r for r in data["rows"] if r.get("flashmla_over_jax_mla")]
    got_above, got_geomean = vs_flashmla.summary([r["flashmla_over_jax_mla"] for r in rows])
    assert (len(rows), above, geomean) == (30, str(got_above), f"{got_geomean:.3f}"), run
    big = next(r for r in rows if (r["heads"], r["batch"], r["k"]) == (128, 128, 2048))
    assert (us, tflops, flash_us) == (f"{big['jax_mla_us']:.1f}", f"{big['jax_mla_tflops']:.0f}",
                                      f"{big['flashmla_us']:.1f}"), run
    low = min(rows, key=lambda r: r["flashmla_over_jax_mla"])
    assert closest == [str(low["heads"]), str(low["batch"]), str(low["k"]),
                       f"{low['flashmla_over_jax_mla']:.3f}"], run
