"""The pure parts of benchmarks/gfx950_bench.py on CPU: the latency-model fit recovers known
coefficients from synthetic timings, the table round-trips and is validated, and the timing
comparison tells different distributions from equal ones."""

import dataclasses
import itertools

import numpy as np
import pytest

from jax_mla._src.aiter import planner
from timing import latency_fit, timing_stats
from timing.latency_fit import Measurement

TRUE = planner.LatencyCoeffs(wave_us=4.0, tile_us=0.35, partial_us=0.8, merge_us=3.0,
                             default_kv_len=4096)


def sweep(coeffs=TRUE, noise=0.0, seed=0, splits=range(1, 17)):
  rng = np.random.default_rng(seed)
  out = []
  for b, h, k, s in itertools.product([1, 4, 32, 128, 512], [16, 128], [64, 1000, 8192],
                                      splits):
    m = Measurement(b, h, k, s, 1.0)
    t = latency_fit.predict(coeffs, m, 256) * (1 + noise * rng.standard_normal())
    out.append(dataclasses.replace(m, latency_us=t))
  return out


def test_features_are_the_planners_model():
  # The planner's own pick is the argmin of the fitted model's prediction, shape by shape, for
  # several coefficient sets: the regressors are the planner's formula, not a look-alike.
  rng = np.random.default_rng(3)
  for _ in range(20):
    c = planner.LatencyCoeffs(*rng.uniform(0.05, 10, 4), default_kv_len=1024)
    for b, h, k in itertools.product([1, 3, 40, 700], [16, 128], [32, 500, 9000]):
      costs = [latency_fit.predict(c, Measurement(b, h, k, s, 1.0), 256) for s in range(1, 17)]
      want = min(range(1, 17), key=lambda s: (costs[s - 1], s))
      tiles = -(-k // 32)
      got = planner._latency_pick(b * -(-h // 64), 256, tiles, c, 16)  # pylint: disable=protected-access
      assert got == want, (c, b, h, k)


def test_exact_timings_give_back_the_coefficients():
  f = latency_fit.fit(sweep(), default_kv_len=4096)
  for name in latency_fit.COEFF_NAMES:
    assert getattr(f.coeffs, name) == pytest.approx(getattr(TRUE, name), rel=1e-9), name
  assert f.rms_relative_error < 1e-9 and f.num_points == 5 * 2 * 3 * 16


def test_noisy_timings_fit_within_noise_and_plan_the_same_splits():
  f = latency_fit.fit(sweep(noise=0.03, seed=1), default_kv_len=4096)
  for name in latency_fit.COEFF_NAMES:
    assert getattr(f.coeffs, name) == pytest.approx(getattr(TRUE, name), rel=0.15), name
  assert 0.01 < f.rms_relative_error < 0.06
  # The planner, with the fitted table, picks splits whose modelled latency is within 2% of
  # the best under the true coefficients.
  cu = planner.COMPUTE_UNITS["gfx950"]
  for b, h, k in itertools.product([1, 8, 64, 300], [16, 128], [100, 2048, 16384]):
    bs_occ = b * -(-h // 64)
    tiles = -(-k // 32)
    picked = planner._latency_pick(bs_occ, cu, tiles, f.coeffs, 16)  # pylint: disable=protected-access
    cost = lambda s: latency_fit.predict(TRUE, Measurement(b, h, k, s, 1.0), cu)  # noqa: E731
    assert cost(picked) <= 1.02 * min(cost(s) for s in range(1, 17)), (b, h, k, picked)


def test_sweeps_that_cannot_determine_the_model_are_refused():
  with pytest.raises(ValueError, match="determines only"):
    latency_fit.fit(sweep(splits=[1]), default_kv_len=4096)
  with pytest.raises(ValueError, match="no measurements"):
    latency_fit.fit([], default_kv_len=4096)
  with pytest.raises(ValueError, match="positive and finite"):
    latency_fit.fit([Measurement(1, 16, 64, 1, float("nan"))], default_kv_len=64)


def test_data_the_model_cannot_describe_is_refused():
  # Latency falling with more waves: the fit would need a negative coefficient.
  data = [dataclasses.replace(m, latency_us=1000.0 / latency_fit.predict(TRUE, m, 256))
          for m in sweep()]
  with pytest.raises(ValueError, match="negative latency coefficients"):
    latency_fit.fit(data, default_kv_len=4096)


def test_table_round_trips_and_the_planner_uses_it(monkeypatch):
  f = latency_fit.fit(sweep(), default_kv_len=4096)
  text = latency_fit.table_json({"gfx950": f})
  table = latency_fit.load_table(text)
  assert table == {"gfx950": f.coeffs}
  monkeypatch.setitem(planner.LATENCY_MODEL_COEFFS, "gfx950", table["gfx950"])
  with_model = planner.num_kv_splits(4, 128, kv_len_hint=8192)
  monkeypatch.delitem(planner.LATENCY_MODEL_COEFFS, "gfx950")
  occupancy = planner.num_kv_splits(4, 128, kv_len_hint=8192)
  assert with_model == planner._latency_pick(8, 256, 256, f.coeffs, 16)  # pylint: disable=protected-access
  assert 1 <= occupancy <= 16


@pytest.mark.parametrize("edit,match", [
    (lambda d: d.update(format="v0"), "not a latency-coefficient table"),
    (lambda d: d["coeffs"]["gfx950"].update(tile_us=-1.0), "tile_us must be a finite number"),
    (lambda d: d["coeffs"]["gfx950"].update(wave_us="4"), "wave_us must be a finite number"),
    (lambda d: d["coeffs"]["gfx950"].pop("merge_us"), "fields"),
    (lambda d: d["coeffs"]["gfx950"].update(max_splits=17), "max_splits must be <= 16"),
    (lambda d: d["coeffs"]["gfx950"].update(default_kv_len=0), "default_kv_len must be an int"),
    (lambda d: d["coeffs"].update(gfx942=d["coeffs"]["gfx950"]), "gfx942.*not known"),
])
def test_bad_tables_are_refused(edit, match):
  import json  # pylint: disable=import-outside-toplevel
  d = json.loads(latency_fit.table_json({"gfx950": latency_fit.fit(sweep(),
                                                                   default_kv_len=4096)}))
  edit(d)
  with pytest.raises(ValueError, match=match):
    latency_fit.load_table(json.dumps(d))


def test_timing_comparison_separates_different_medians():
  rng = np.random.default_rng(0)
  a = 100 + rng.standard_normal(30)
  b = 103 + rng.standard_normal(30)
  c = timing_stats.compare(a, b)
  assert c.significant() and c.ratio == pytest.approx(1.03, abs=0.01)
  same = timing_stats.compare(a, 100 + rng.standard_normal(30))
  assert not same.significant()


def test_permutation_test_without_scipy():
  rng = np.random.default_rng(1)
  a, b = 10 + rng.standard_normal(20), 12 + rng.standard_normal(20)
  assert timing_stats.permutation_p_value(a, b, rounds=2000) < 0.01
  assert timing_stats.permutation_p_value(a, 10 + rng.standard_normal(20), rounds=2000) > 0.05
  with pytest.raises(ValueError, match="at least 2"):
    timing_stats.compare([1.0], [2.0])


def test_benchmark_refuses_to_run_without_gfx950():
  import os, pathlib, subprocess, sys  # pylint: disable=import-outside-toplevel,multiple-imports
  from jax_mla._src import backends  # pylint: disable=import-outside-toplevel
  if backends.gfx950_available()[0]:
    pytest.skip("a gfx950 is present")
  root = pathlib.Path(__file__).parent.parent
  r = subprocess.run([sys.executable, str(root / "benchmarks" / "gfx950_bench.py"), "fit", "--out",
                      os.devnull], capture_output=True, text=True, timeout=120,
                     check=False)
  assert r.returncode == 2 and "needs an MI355X" in r.stderr, r.stderr[-2000:]
