"""Arch detection fails closed: only a device positively identified as gfx950 counts."""

import dataclasses

import pytest

from jax_mla._src import backends, platform


@dataclasses.dataclass
class FakeClient:
  platform_version: str


@dataclasses.dataclass
class FakeDevice:
  platform: str
  device_kind: str = ""
  compute_capability: str | None = None
  client: FakeClient | None = None


@pytest.mark.parametrize("device,arch", [
    (FakeDevice("rocm", "AMD Instinct MI355X", "gfx950"), "gfx950"),
    (FakeDevice("rocm", "", "gfx950:sramecc+:xnack-"), "gfx950"),
    (FakeDevice("rocm", "AMD Instinct MI355X"), "gfx950"),
    (FakeDevice("rocm", "AMD Instinct MI300X", "gfx942"), "gfx942"),
    (FakeDevice("rocm", "some future GPU"), None),
    (FakeDevice("rocm"), None),
    (FakeDevice("cuda", "NVIDIA H200", "9.0"), None),
    (FakeDevice("cpu", "cpu"), None),
    # Some JAX versions call every GPU's platform "gpu"; the client says which runtime.
    (FakeDevice("gpu", "AMD Instinct MI355X", "gfx950", FakeClient("rocm 7.1.0")), "gfx950"),
    (FakeDevice("gpu", "NVIDIA H200", "9.0", FakeClient("cuda 13000")), None),
    (FakeDevice("gpu", "mystery", "gfx950", FakeClient("")), None),
])
def test_device_arch(device, arch):
  assert platform.device_arch(device) == arch
  assert platform.is_gfx950(device) == (arch == "gfx950")


def test_gfx950_predicate_fails_closed_for_an_unknown_rocm_device(monkeypatch):
  monkeypatch.setattr(backends.jax, "devices", lambda: [FakeDevice("rocm", "mystery")])
  ok, why = backends.gfx950_available()
  assert not ok and "not recognised as gfx950" in why


def test_gfx950_predicate_says_no_on_this_cpu():
  ok, why = backends.gfx950_available()
  assert not ok and "not a ROCm GPU" in why


def test_gfx950_predicate_needs_code_objects(monkeypatch):
  monkeypatch.setattr(backends.jax, "devices", lambda: [FakeDevice("rocm", "", "gfx950")])
  monkeypatch.setenv("JAX_MLA_HSA_DIR", "/nonexistent-jax-mla-test")
  ok, why = backends.gfx950_available()
  assert not ok and "no usable code object" in why
