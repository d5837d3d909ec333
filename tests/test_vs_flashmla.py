"""benchmarks/vs_flashmla.py's suites (its timing needs a GPU and FlashMLA): "flash" and
"others" split "all" exactly, so a run cut by a time limit can be completed by the other."""

import pytest

import vs_flashmla


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
