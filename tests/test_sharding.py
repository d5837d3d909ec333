"""Decode on many devices (8 CPU host devices): the shard_map recipes of jax_mla.sharding give the
single-device results, the row layout compiles without collectives, a sharded decode exports for
rocm with per-shard custom-call shapes, and a plain jit over sharded operands is refused.

XLA_FLAGS=--xla_force_host_platform_device_count=8 must be set before JAX starts, so when this
process has fewer devices the one test `test_in_a_process_with_8_devices` reruns this file in a
subprocess with the flag (the rest of the suite keeps its single device); there every other test
runs and that one skips.
"""

import functools
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from support.child_process import child_env, neutral_cwd
from support.compare import assert_bit_identical
from support.rows import equal_width_batches, make_batch
import jax_mla
from jax_mla import sharding as jms

NUM_DEVICES = 8
FLAG = f"--xla_force_host_platform_device_count={NUM_DEVICES}"
HAVE_DEVICES = len(jax.devices()) >= NUM_DEVICES
needs_devices = pytest.mark.skipif(
    not HAVE_DEVICES, reason=f"needs {NUM_DEVICES} devices: run by test_in_a_process_with_8_devices")
COLLECTIVES = re.compile(r"\b(all-gather|all-reduce|collective-permute|all-to-all|"
                         r"reduce-scatter)\b")
FIELDS = ("q", "q_rope", "kv", "kv_rope", "kv_indptr", "kv_indices")


@pytest.mark.skipif(HAVE_DEVICES, reason="this process already has the devices")
def test_in_a_process_with_8_devices():
  # The child imports exactly what this process imports (the installed or the in-place package).
  # JAX_PLATFORMS=cpu: on a GPU machine the child must still get its 8 host devices.
  env = child_env(XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + FLAG).strip(),
                  JAX_PLATFORMS="cpu")
  result = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
      env=env, cwd=neutral_cwd(), capture_output=True, text=True, timeout=900, check=False)
  tail = (result.stdout + result.stderr)[-6000:]
  assert result.returncode == 0, f"8-device run failed:\n{tail}"
  assert " passed" in result.stdout and "skipped" in result.stdout, tail  # the launcher skips


def mesh_of(size, axis_type=AxisType.Explicit):
  return jax.make_mesh((size,), ("x",), axis_types=(axis_type,), devices=jax.devices()[:size])


def assert_same(name, actual, expected):
  assert_bit_identical(name, actual, expected, what="the single-device result")


def device_batches(num_heads, count, *, lengths=((5, 0, 40), (70, 1, 33)), pool_rows=40,
                   sink=0.5, seed=0):
  """One Batch per device, with kv_indices of one length (a trailing junk entry or more)."""
  return equal_width_batches(np.random.default_rng(seed), count, num_heads=num_heads,
                             lengths=lengths, pool_rows=pool_rows, sink=sink, extra=2)


def row_blocks(bs):
  """The row layout: every array is the per-device blocks concatenated on the leading axis."""
  return [np.concatenate([getattr(b, f) for b in bs]) for f in FIELDS]


def blocks_of(x, count):
  x = np.asarray(x)
  return np.split(x, count)


# --- rows across devices --------------------------------------------------------------------------

def assert_rows_match_single_device(bs, mesh, **kwargs):
  """Decodes the per-device batches `bs` in the row layout over `mesh` and checks each device's
  block bit for bit against that batch decoded alone; returns the global out."""
  count = len(bs)
  out, lse = jax.jit(jms.decode_rows_sharded(mesh, "x", **kwargs))(*row_blocks(bs), bs[0].sink)
  single = jax.jit(functools.partial(jax_mla.decode, **kwargs))
  for d, b in enumerate(bs):
    want_out, want_lse = single(*b.args())
    assert_same(f"device {d} out", blocks_of(out, count)[d], want_out)
    if kwargs.get("return_lse", True):
      assert_same(f"device {d} lse", blocks_of(lse, count)[d], want_lse)
    else:
      assert lse is None
  return out


@needs_devices
@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto], ids=str)
@pytest.mark.parametrize("backend,num_kv_splits", [("host", 1), ("host", 3), ("reference", None)])
def test_rows_split_path_equals_single_device(backend, num_kv_splits, axis_type):
  out = assert_rows_match_single_device(
      device_batches(16, NUM_DEVICES), mesh_of(NUM_DEVICES, axis_type), backend=backend,
      num_kv_splits=num_kv_splits, return_lse=num_kv_splits != 1)
  assert out.sharding.spec[0] == "x"


GPUS = [d for d in jax.devices() if d.platform in ("gpu", "cuda", "rocm")]


@pytest.mark.gpu
@pytest.mark.skipif(len(GPUS) < 2, reason=f"needs 2 or more GPUs; this process has {len(GPUS)}")
@pytest.mark.parametrize("backend", ["reference", "pallas"])
def test_rows_across_gpus_equal_single_device(backend):
  """The row layout over every GPU of the machine (issue 9): each device's block equals that
  device's batch decoded alone on one GPU, bit for bit (the same program on the same data)."""
  count = len(GPUS)
  bs = device_batches(128, count, lengths=((5, 0, 300), (700, 1, 33)), pool_rows=800)
  out = assert_rows_match_single_device(bs, mesh_of(count), backend=backend)
  assert {s.device for s in out.addressable_shards} == set(GPUS)


@needs_devices
def test_rows_pallas_backend_equals_single_device(monkeypatch):
  """backend="pallas" per device (the Triton kernel in Pallas interpret mode stands in for the
  GPU's kernel here), the rows across 8 devices."""
  from jax_mla._src.pallas import backend as pallas_backend  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(pallas_backend, "device_kernel", lambda: ("triton", "interpret mode"))
  monkeypatch.setattr(pallas_backend, "_interpret", lambda: True)
  assert_rows_match_single_device(device_batches(16, NUM_DEVICES), mesh_of(NUM_DEVICES),
                                  backend="pallas", num_kv_splits=2)


@needs_devices
@pytest.mark.parametrize("return_lse", [True, False])
def test_rows_persistent_path_equals_single_device(return_lse):
  bs = device_batches(128, NUM_DEVICES, lengths=((5, 0), (70, 33)))
  mesh = mesh_of(NUM_DEVICES)
  workspace = jms.make_sharded_workspace(mesh, "x", 8, 2, allow_any_partitions=True)
  fn = jax.jit(jms.decode_persistent_rows_sharded(mesh, "x", backend="host",
                                                  return_lse=return_lse), donate_argnums=7)
  out, lse, workspace = fn(*row_blocks(bs), bs[0].sink, workspace)
  # A second call through the returned (donated) workspace: per-device calls stay ordered.
  out2, _, workspace = fn(*row_blocks(bs), bs[0].sink, workspace)
  assert_same("second call", out2, out)
  assert not np.asarray(workspace.cnt).any(), "counters must be back at zero on every device"
  single = jax.jit(lambda *a: jax_mla.decode_persistent(
      *a, jax_mla.make_workspace(8, 2, allow_any_partitions=True), backend="host",
      return_lse=return_lse)[:2])
  for d, b in enumerate(bs):
    want_out, want_lse = single(*b.args())
    assert_same(f"device {d} out", blocks_of(out, NUM_DEVICES)[d], want_out)
    if return_lse:
      assert_same(f"device {d} lse", blocks_of(lse, NUM_DEVICES)[d], want_lse)
    else:
      assert lse is None


@needs_devices
def test_sharded_workspace_is_one_workspace_per_device():
  mesh = mesh_of(4)
  ws = jms.make_sharded_workspace(mesh, "x", 8, 5, allow_any_partitions=True)
  assert ws.desc.shape == (4 * 8, 8) and ws.o_acc.shape == (4 * 16, 128, 512)
  for field in ("o_acc", "lse_acc", "desc", "cnt", "arange"):
    array = getattr(ws, field)
    assert array.sharding.spec[0] == "x"
    shards = array.addressable_shards
    assert len({s.device for s in shards}) == 4
  for shard in ws.arange.addressable_shards:  # each device: its own 0..max_rows
    np.testing.assert_array_equal(np.asarray(shard.data), np.arange(6))
  assert not np.asarray(ws.cnt).any()
  with pytest.raises(ValueError, match="multiple of 8"):
    jms.make_sharded_workspace(mesh, "x", 12, 5)
  with pytest.raises(ValueError, match="not an axis of the mesh"):
    jms.make_sharded_workspace(mesh, "y", 8, 5)


@needs_devices
@pytest.mark.parametrize("persistent", [False, True], ids=["split", "persistent"])
def test_row_layout_compiles_without_collectives(persistent):
  mesh = mesh_of(NUM_DEVICES)
  if persistent:
    bs = device_batches(128, NUM_DEVICES, lengths=((5, 0), (70, 33)))
    ws = jms.make_sharded_workspace(mesh, "x", 8, 2, allow_any_partitions=True)
    fn = jax.jit(jms.decode_persistent_rows_sharded(mesh, "x", backend="host"))
    args = (*row_blocks(bs), bs[0].sink, ws)
  else:
    bs = device_batches(16, NUM_DEVICES)
    fn = jax.jit(jms.decode_rows_sharded(mesh, "x", backend="host", num_kv_splits=2))
    args = (*row_blocks(bs), bs[0].sink)
  text = fn.lower(*args).compile().as_text()
  assert "custom-call" in text and "jax_mla_" in text
  assert not COLLECTIVES.findall(text), sorted(set(COLLECTIVES.findall(text)))


# --- heads across devices -------------------------------------------------------------------------

@needs_devices
@pytest.mark.parametrize("num_devices", [2, 4, 8])
@pytest.mark.parametrize("backend", ["host", "reference"])
def test_heads_split_path_equals_single_device(num_devices, backend):
  rng = np.random.default_rng(num_devices)
  b = make_batch(rng, num_heads=128, lengths=[5, 0, 70], pool_rows=40,
                 sink=rng.standard_normal(128).astype(np.float32))
  mesh = mesh_of(num_devices)
  kwargs = dict(backend=backend, num_kv_splits=2)
  out, lse = jax.jit(jms.decode_heads_sharded(mesh, "x", **kwargs))(*b.args())
  assert out.sharding.spec[1] == "x" and lse.sharding.spec[1] == "x"
  want_out, want_lse = jax.jit(functools.partial(jax_mla.decode, **kwargs))(*b.args())
  assert_same("out", out, want_out)
  assert_same("lse", lse, want_lse)
  with pytest.raises(ValueError, match="do not split over"):
    jms.decode_heads_sharded(mesh_of(8), "x", **kwargs)(b.q[:, :12], b.q_rope[:, :12],
                                                        *b.args()[2:6])


@needs_devices
def test_heads_shard_runs_the_kernel_on_its_heads():
  """Each shard's custom call sees 128/D heads (here: 8 devices, 16 heads)."""
  rng = np.random.default_rng(1)
  b = make_batch(rng, num_heads=128, lengths=[5, 9], pool_rows=40)
  fn = jax.jit(jms.decode_heads_sharded(mesh_of(8), "x", backend="host", num_kv_splits=2))
  text = fn.lower(*b.args()).as_text()
  calls = [line for line in text.splitlines() if "jax_mla_split_decode_v1" in line]
  assert calls and all("tensor<2x16x512xui8>" in line for line in calls), calls


# --- rocm export of a sharded decode ----------------------------------------------------------------

def sharded_specs(mesh, num_heads, tokens, kv_rows, num_indices, num_seqs, row_layout):
  blocks = NamedSharding(mesh, P("x"))
  heads = NamedSharding(mesh, P(None, "x"))
  rep = NamedSharding(mesh, P())
  q_sharding = blocks if row_layout else heads
  kv_sharding = blocks if row_layout else rep
  return (jax.ShapeDtypeStruct((tokens, num_heads, 512), jnp.uint8, sharding=q_sharding),
          jax.ShapeDtypeStruct((tokens, num_heads, 64), jnp.bfloat16, sharding=q_sharding),
          jax.ShapeDtypeStruct((kv_rows, 512), jnp.uint8, sharding=kv_sharding),
          jax.ShapeDtypeStruct((kv_rows, 64), jnp.bfloat16, sharding=kv_sharding),
          jax.ShapeDtypeStruct((num_seqs + 1,), jnp.int32, sharding=kv_sharding),
          jax.ShapeDtypeStruct((num_indices,), jnp.int32, sharding=kv_sharding),
          jax.ShapeDtypeStruct((num_heads,), jnp.float32,
                               sharding=rep if row_layout else NamedSharding(mesh, P("x"))))


def export_calls(fn, specs, target):
  exported = jax.export.export(
      jax.jit(fn), platforms=["rocm"],
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(target)])(*specs)
  text = exported.mlir_module()
  return exported, [line for line in text.splitlines()
                    if "stablehlo.custom_call" in line and target in line]


@needs_devices
def test_rocm_export_of_row_sharded_split_decode_has_per_shard_shapes():
  mesh = mesh_of(4)
  # 4 devices x (3 sequences, 48 pool rows, 60 indices): 12 tokens, 192 rows, 16 indptr entries.
  specs = sharded_specs(mesh, 16, 12, 192, 240, 4 * 4 - 1, row_layout=True)
  fn = jms.decode_rows_sharded(mesh, "x", backend="gfx950", num_kv_splits=2)
  exported, calls = export_calls(fn, specs, "jax_mla_split_decode_v1")
  assert exported.nr_devices == 4
  assert len(calls) == 1, calls
  for shape in ("tensor<3x16x512xui8>", "tensor<48x512xui8>", "tensor<4xi32>", "tensor<60xi32>"):
    assert shape in calls[0], (shape, calls[0])


@needs_devices
def test_rocm_export_of_head_sharded_split_decode_has_per_shard_shapes():
  mesh = mesh_of(8)
  specs = sharded_specs(mesh, 128, 3, 50, 70, 3, row_layout=False)
  fn = jms.decode_heads_sharded(mesh, "x", backend="gfx950", num_kv_splits=2)
  exported, calls = export_calls(fn, specs, "jax_mla_split_decode_v1")
  assert exported.nr_devices == 8 and len(calls) == 1
  assert "tensor<3x16x512xui8>" in calls[0] and "tensor<16xf32>" in calls[0], calls[0]


@needs_devices
def test_rocm_export_of_row_sharded_persistent_decode():
  mesh = mesh_of(2)
  specs = sharded_specs(mesh, 128, 4, 64, 40, 2 * 3 - 1, row_layout=True)
  ws = jax.eval_shape(lambda: jax_mla.make_workspace(8, 2))
  ws = jax.tree.map(lambda a: jax.ShapeDtypeStruct((2 * a.shape[0],) + a.shape[1:], a.dtype,
                                                   sharding=NamedSharding(mesh, P("x"))), ws)
  fn = jms.decode_persistent_rows_sharded(mesh, "x", backend="gfx950")
  exported, calls = export_calls(fn, (*specs, ws), "jax_mla_persistent_decode_v1")
  assert exported.nr_devices == 2 and len(calls) == 1
  assert "tensor<2x128x512xui8>" in calls[0] and "tensor<16x128x512xf32>" in calls[0], calls[0]


# --- a plain jit over sharded operands ------------------------------------------------------------

def sharded_batch(mesh):
  """One valid global batch whose q rows are split over the mesh (what a user might try)."""
  b = make_batch(np.random.default_rng(2), num_heads=16, lengths=[5, 0, 40, 9], pool_rows=40,
                 sink=0.5)
  args = list(b.args())
  args[0] = jax.device_put(args[0], NamedSharding(mesh, P("x")))
  return args


@needs_devices
@pytest.mark.parametrize("axis_type,when", [(AxisType.Explicit, "is sharded as"),
                                            (AxisType.Auto, "compiled for 4 devices")], ids=str)
def test_plain_jit_over_sharded_operands_is_refused(axis_type, when):
  mesh = mesh_of(4, axis_type)
  args = sharded_batch(mesh)
  fn = jax.jit(functools.partial(jax_mla.decode, backend="host", num_kv_splits=2))
  with pytest.raises(ValueError, match=f"{when}.*outside shard_map.*decode_rows_sharded"):
    fn(*args)


@needs_devices
def test_eager_call_on_sharded_arrays_is_refused():
  args = sharded_batch(mesh_of(4, AxisType.Auto))
  with pytest.raises(ValueError, match="sharded as .*outside shard_map"):
    jax_mla.decode(*args, backend="host", num_kv_splits=2)


@needs_devices
def test_plain_jit_of_persistent_over_many_devices_is_refused():
  mesh = mesh_of(4, AxisType.Auto)
  bs = device_batches(128, 1, lengths=((5, 0, 9, 1),))
  args = list(bs[0].args())
  args[0] = jax.device_put(args[0], NamedSharding(mesh, P("x")))
  fn = jax.jit(lambda *a: jax_mla.decode_persistent(
      *a, jax_mla.make_workspace(8, 4), backend="host")[0])
  with pytest.raises(ValueError, match="decode_persistent is being compiled for 4 devices"):
    fn(*args)


@needs_devices
def test_reference_backend_partitions_under_plain_jit():
  """The pure-JAX reference is ordinary XLA: plain jit partitions it (not refused)."""
  mesh = mesh_of(4, AxisType.Auto)
  args = sharded_batch(mesh)
  fn = jax.jit(functools.partial(jax_mla.decode, backend="reference"))
  out, _ = fn(*args)
  want, _ = fn(*[np.asarray(a) for a in args])
  assert_same("out", out, want)


@needs_devices
def test_the_sharded_benchmark_runs(tmp_path, monkeypatch, capsys):
  """benchmarks/sharded_decode.py (issue 9's measurement, for a machine with several GPUs) on 2
  of the host devices, tiny sizes: it runs and writes its rows. Its timings mean nothing here."""
  import runpy  # pylint: disable=import-outside-toplevel
  script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "sharded_decode.py")
  out = tmp_path / "sharded"
  monkeypatch.setattr(sys, "argv", [script, "--backends", "reference,host", "--devices", "2",
                                    "--batch-per-device", "2", "--heads", "16", "--kv-len", "64",
                                    "--pool", "256", "--steps", "2", "--rounds", "1",
                                    "--out", str(out)])
  runpy.run_path(script, run_name="__main__")
  lines = (tmp_path / "sharded.csv").read_text().splitlines()
  assert lines[1].startswith("backend,devices,") and len(lines) == 4, lines
  assert [line.split(",")[:2] for line in lines[2:]] == [["reference", "2"], ["host", "2"]]
  assert "scaling" in capsys.readouterr().out
