"""The kernel manifest, the AMDGPU ELF reader, and finding/verifying code objects.

The verification tests run on real gfx950 (and gfx942) code objects assembled by clang-22/lld-22
(tests/amdgpu_asm.py), each broken in one way. Without those tools they skip and say so; set
JAX_MLA_REQUIRE_LLVM=1 (CI does) to make a missing toolchain fail instead of skip.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import shutil
import struct
import sys
import warnings
from pathlib import Path

import hypothesis
import hypothesis.strategies as st
import pytest

from support import amdgpu_asm
from jax_mla._src.aiter.code_objects import elf as amdgpu_elf
from jax_mla._src.aiter.code_objects import find as code_objects
from jax_mla._src.aiter.code_objects import manifest as manifest_lib

NM_ID = "mla_v4_nm"
PS_ID = "mla_v4_nm_ps"
NM_SYMBOL = "_ZN5aiter36mla_a8w8_qh64_qseqlen1_gqaratio64_nmE"
PS_SYMBOL = "_ZN5aiter39mla_a8w8_qh64_qseqlen1_gqaratio64_nm_psE"
NM_FILE = "mla_a8w8_qh64_qseqlen1_gqaratio64_nm.co"
PS_FILE = "mla_a8w8_qh64_qseqlen1_gqaratio64_nm_ps.co"
OTHER_SYMBOL = "_ZN5aiter36mla_a8w8_qh64_qseqlen1_gqaratio64_xxE"

# One spec per file the tests need: the good ones, and one per check that must refuse a file.
SPECS = {
    "nm": amdgpu_asm.KernelSpec(NM_SYMBOL),
    "nm_cov6": amdgpu_asm.KernelSpec(NM_SYMBOL, code_object_version=6),
    "ps": amdgpu_asm.KernelSpec(PS_SYMBOL),
    "kernarg_320": amdgpu_asm.KernelSpec(NM_SYMBOL, kernarg_size=320,
                                         descriptor_kernarg_size=320),
    "gfx942": amdgpu_asm.KernelSpec(NM_SYMBOL, mcpu="gfx942"),
    "misnamed": amdgpu_asm.KernelSpec(OTHER_SYMBOL),
    "symbol_missing": amdgpu_asm.KernelSpec(OTHER_SYMBOL, metadata_name=NM_SYMBOL),
    "block_128": amdgpu_asm.KernelSpec(NM_SYMBOL, reqd_workgroup_size=(128, 1, 1)),
    "no_reqd_workgroup": amdgpu_asm.KernelSpec(NM_SYMBOL, reqd_workgroup_size=None),
    "wave32": amdgpu_asm.KernelSpec(NM_SYMBOL, wavefront_size=32),
    "no_metadata": amdgpu_asm.KernelSpec(NM_SYMBOL, with_metadata=False),
}

_MISSING_TOOLS = amdgpu_asm.missing_tools()
_REQUIRE_LLVM = os.environ.get("JAX_MLA_REQUIRE_LLVM") == "1"


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> dict[str, Path]:
  """Every code object of SPECS, assembled once per session."""
  if _MISSING_TOOLS:
    message = (f"{' and '.join(_MISSING_TOOLS)} not on PATH: these tests assemble real gfx950 "
               f"code objects (apt-get install -y clang-22 lld-22)")
    if _REQUIRE_LLVM:
      pytest.fail(message + "; JAX_MLA_REQUIRE_LLVM=1 forbids skipping")
    pytest.skip(message)
  out = tmp_path_factory.mktemp("code_objects")
  return {name: amdgpu_asm.assemble(spec, out, name) for name, spec in SPECS.items()}


@pytest.fixture(autouse=True)
def fresh_search_state(monkeypatch):
  """No code-object dir, no JAX_MLA_HSA_DIR, no cached verdicts, before and after each test."""
  monkeypatch.delenv(code_objects.ENV_VAR, raising=False)
  code_objects.set_code_object_dir(None)
  yield
  code_objects.set_code_object_dir(None)


@pytest.fixture
def isolated_sys_path(monkeypatch, tmp_path) -> Path:
  """sys.path holding one empty directory, so no real aiter install can be found; returns it."""
  site = tmp_path / "isolated_site"
  site.mkdir()
  monkeypatch.setattr(sys, "path", [str(site)])
  for name in ("aiter", "aiter_meta"):
    monkeypatch.delitem(sys.modules, name, raising=False)
  return site


def nm_entry() -> manifest_lib.KernelEntry:
  return manifest_lib.kernel(NM_ID)


def sha256_of(path: Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def place(built: dict[str, Path], name: str, directory: Path, file: str = NM_FILE) -> Path:
  """Copies the assembled object `name` to `directory/file`, creating the directory."""
  directory.mkdir(parents=True, exist_ok=True)
  return Path(shutil.copyfile(built[name], directory / file))


def assert_refused(verdict: code_objects.Verdict, path: Path | str, check: str,
                   *fragments: str) -> None:
  assert verdict.status == "refused", verdict
  assert not verdict.usable
  assert verdict.check == check, verdict.message
  assert str(path) in verdict.message
  assert f"'{check}'" in verdict.message
  for fragment in fragments:
    assert fragment in verdict.message


# ------------------------------------------------------------------------------------------------
# The manifest


def test_manifest_ids_are_the_ones_the_cpp_side_uses():
  manifest = manifest_lib.load_manifest()
  assert manifest.schema == 1
  assert manifest.ids == (NM_ID, PS_ID)
  assert len(set(manifest.ids)) == len(manifest.ids)


@pytest.mark.parametrize(
    "kernel_id, file, symbol, family",
    [pytest.param(NM_ID, NM_FILE, NM_SYMBOL, "split", id="nm"),
     pytest.param(PS_ID, PS_FILE, PS_SYMBOL, "persistent", id="nm_ps")])
def test_manifest_entries_match_kernels_md(kernel_id, file, symbol, family):
  entry = manifest_lib.kernel(kernel_id)
  assert (entry.file, entry.symbol, entry.family) == (file, symbol, family)
  assert entry.arch == "gfx950"
  assert entry.kernarg_size == 336
  assert entry.block == (256, 1, 1)
  assert entry.wavefront == 64
  assert entry.aiter_subdir == "hsa/gfx950/mla_v4"


def test_nm_serves_the_documented_gqa_and_token_pairs():
  assert manifest_lib.kernel(NM_ID).serves == ((16, 1), (16, 2), (16, 4), (32, 1), (64, 1),
                                               (128, 1))
  assert manifest_lib.kernel(PS_ID).serves == ((128, 1),)


def test_manifest_known_hashes_are_the_kernels_md_builds():
  nm, ps = manifest_lib.kernel(NM_ID), manifest_lib.kernel(PS_ID)
  assert nm.known_hashes == {"46bbfd176840c6289cbcd14c1022a8c8616b33678000d991471a6aebcc1d68ac"}
  assert ps.known_hashes == {"b1a1944b57d006aba1fa91fff4d1ddc87029bef94d8bea066e59a4f7c5ab342c"}
  assert all(build.note for build in nm.known_sha256 + ps.known_sha256)


def test_unknown_kernel_id_lists_the_known_ones():
  with pytest.raises(KeyError, match="mla_v4_nm_ps"):
    manifest_lib.kernel("mla_v4_nope")


def test_manifest_in_use_is_the_repositorys():
  # From a source checkout it is <repo>/hsa/manifest.json itself; from an installed wheel, the
  # copy the build installed: either way, the same bytes.
  repo = Path(__file__).resolve().parent.parent
  assert manifest_lib.manifest_path().read_bytes() == (repo / "hsa" / "manifest.json").read_bytes()


def test_installed_manifest_is_preferred_to_the_checkout_one(monkeypatch, tmp_path):
  installed = tmp_path / "site" / "jax_mla" / "hsa" / "manifest.json"
  checkout = tmp_path / "repo" / "hsa" / "manifest.json"
  monkeypatch.setattr(manifest_lib, "MANIFEST_CANDIDATES", (installed, checkout))
  with pytest.raises(manifest_lib.ManifestError, match="missing"):
    manifest_lib.manifest_path()
  checkout.parent.mkdir(parents=True)
  checkout.write_text("{}")
  assert manifest_lib.manifest_path() == checkout
  installed.parent.mkdir(parents=True)
  installed.write_text("{}")
  assert manifest_lib.manifest_path() == installed


def _valid_manifest_data() -> dict:
  return json.loads(manifest_lib.manifest_path().read_text())


def _set(path: tuple, value):
  def mutate(data):
    target = data
    for key in path[:-1]:
      target = target[key]
    target[path[-1]] = value
  return mutate


def _delete(path: tuple):
  def mutate(data):
    target = data
    for key in path[:-1]:
      target = target[key]
    del target[path[-1]]
  return mutate


def _duplicate_first_kernel(data):
  data["kernels"].append(copy.deepcopy(data["kernels"][0]))


@pytest.mark.parametrize("mutate, fragment", [
    pytest.param(_set(("schema",), 2), "schema", id="schema_2"),
    pytest.param(_delete(("kernels", 0, "symbol")), "symbol", id="missing_field"),
    pytest.param(_set(("kernels", 0, "extra"), 1), "extra", id="unknown_field"),
    pytest.param(_set(("kernels", 0, "kernarg_size"), True), "kernarg_size", id="bool_int"),
    pytest.param(_set(("kernels", 0, "kernarg_size"), "336"), "kernarg_size", id="str_int"),
    pytest.param(_set(("kernels", 0, "block"), [256, 1]), "block", id="block_len"),
    pytest.param(_set(("kernels", 0, "wavefront"), 48), "wavefront", id="wavefront"),
    pytest.param(_set(("kernels", 0, "family"), "fused"), "family", id="family"),
    pytest.param(_set(("kernels", 0, "arch"), "gfx999"), "arch", id="arch"),
    pytest.param(_set(("kernels", 0, "file"), "gfx950/x.co"), "file", id="file_path"),
    pytest.param(_set(("kernels", 0, "id"), "Mla"), "id", id="id_pattern"),
    pytest.param(_set(("kernels", 0, "serves"), []), "serves", id="serves_empty"),
    pytest.param(_set(("kernels", 0, "serves"), [[16, 1], [16, 1]]), "serves", id="serves_dup"),
    pytest.param(_set(("kernels", 0, "serves"), [[16, 0]]), "serves", id="serves_zero"),
    pytest.param(_set(("kernels", 0, "known_sha256", 0, "sha256"), "ABC"), "sha256",
                 id="sha_format"),
    pytest.param(_set(("kernels", 0, "known_sha256", 0, "note"), ""), "note", id="empty_note"),
    pytest.param(_set(("kernels", 0, "aiter_subdir"), "../hsa"), "aiter_subdir",
                 id="subdir_escape"),
    pytest.param(_duplicate_first_kernel, "unique", id="duplicate_id"),
])
def test_manifest_rejects_schema_violations(mutate, fragment):
  data = _valid_manifest_data()
  mutate(data)
  with pytest.raises(manifest_lib.ManifestError, match=fragment) as info:
    manifest_lib.parse_manifest(data, "test-manifest.json")
  assert "test-manifest.json" in str(info.value)


def test_manifest_rejects_repeated_json_keys(tmp_path):
  path = tmp_path / "manifest.json"
  path.write_text('{"schema": 1, "schema": 1, "kernels": []}')
  with pytest.raises(manifest_lib.ManifestError, match="repeats the key"):
    manifest_lib.load_manifest(path)


def test_manifest_rejects_invalid_json(tmp_path):
  path = tmp_path / "manifest.json"
  path.write_text('{"schema": 1,')
  with pytest.raises(manifest_lib.ManifestError, match="not valid JSON"):
    manifest_lib.load_manifest(path)


# ------------------------------------------------------------------------------------------------
# The ELF reader on assembled objects


def test_reader_decodes_header_symbols_and_metadata(built):
  image = built["nm"].read_bytes()
  header = amdgpu_elf.read_header(image)
  assert header.e_machine == amdgpu_elf.EM_AMDGPU
  assert header.mach == 0x4F and header.arch == "gfx950"
  assert header.os_abi == amdgpu_elf.ELFOSABI_AMDGPU_HSA
  assert {NM_SYMBOL, NM_SYMBOL + ".kd"} <= amdgpu_elf.read_symbol_names(image, header)
  (kernel,) = amdgpu_elf.kernels_in(amdgpu_elf.read_metadata(image, header))
  assert (kernel.name, kernel.symbol) == (NM_SYMBOL, NM_SYMBOL + ".kd")
  assert kernel.kernarg_segment_size == 336
  assert kernel.reqd_workgroup_size == [256, 1, 1]
  assert kernel.wavefront_size == 64
  assert kernel.group_segment_fixed_size == 0


def test_reader_reports_gfx942_mach(built):
  header = amdgpu_elf.read_header(built["gfx942"].read_bytes())
  assert (header.mach, header.arch) == (0x4C, "gfx942")


# ------------------------------------------------------------------------------------------------
# Verdicts


@pytest.mark.parametrize("name", ["nm", "nm_cov6"])
def test_good_object_is_an_unrecognized_build_with_a_warning(built, name):
  path = built[name]
  sha = sha256_of(path)
  with pytest.warns(code_objects.UnrecognizedCodeObjectWarning) as record:
    verdict = code_objects.verify_code_object(path, nm_entry())
  assert verdict.status == "unrecognized-build" and verdict.usable
  assert verdict.check is None and verdict.sha256 == sha
  (warning,) = record
  assert sha in str(warning.message) and str(path) in str(warning.message)


def test_known_hash_is_verified_without_a_warning(built):
  path = built["nm"]
  entry = dataclasses.replace(
      nm_entry(), known_sha256=nm_entry().known_sha256 +
      (manifest_lib.KnownBuild(sha256_of(path), "assembled by the tests"),))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    verdict = code_objects.verify_code_object(path, entry)
  assert verdict.status == "verified"
  assert verdict.known_build_note == "assembled by the tests"
  assert str(path) in verdict.message


def test_find_reports_verified_when_the_manifest_knows_the_hash(built, monkeypatch, tmp_path):
  directory = tmp_path / "hsa"
  path = place(built, "nm", directory)
  manifest = manifest_lib.load_manifest()
  known = manifest_lib.KnownBuild(sha256_of(path), "assembled by the tests")
  patched = dataclasses.replace(manifest, kernels=tuple(
      dataclasses.replace(k, known_sha256=k.known_sha256 + (known,)) if k.id == NM_ID else k
      for k in manifest.kernels))
  monkeypatch.setattr(manifest_lib, "_default_manifest", lambda: patched)
  code_objects.set_code_object_dir(directory)
  found = code_objects.find_code_object(NM_ID)
  assert found.verdict.status == "verified"
  assert found.path == directory.resolve() / NM_FILE


def test_persistent_object_verifies_against_its_own_entry_only(built):
  with pytest.warns(code_objects.UnrecognizedCodeObjectWarning):
    assert code_objects.verify_code_object(built["ps"], manifest_lib.kernel(PS_ID)).usable
  verdict = code_objects.verify_code_object(built["ps"], nm_entry())
  assert_refused(verdict, built["ps"], "kernel-in-metadata", NM_SYMBOL, PS_SYMBOL)


@pytest.mark.parametrize("name, check, fragments", [
    pytest.param("kernarg_320", "kernarg_segment_size", ("expected .kernarg_segment_size 336",
                                                         "found 320"), id="kernarg_320"),
    pytest.param("gfx942", "mach", ("expected gfx950", "found gfx942"), id="gfx942"),
    pytest.param("misnamed", "kernel-in-metadata", (NM_SYMBOL, OTHER_SYMBOL), id="misnamed"),
    pytest.param("symbol_missing", "symbol-table", (NM_SYMBOL,), id="symbol_missing"),
    pytest.param("block_128", "reqd_workgroup_size", ("[256, 1, 1]", "[128, 1, 1]"),
                 id="block_128"),
    pytest.param("no_reqd_workgroup", "reqd_workgroup_size", ("[256, 1, 1]", "absent"),
                 id="no_reqd_workgroup"),
    pytest.param("wave32", "wavefront_size", ("expected .wavefront_size 64", "found 32"),
                 id="wave32"),
    pytest.param("no_metadata", "metadata-note", ("NT_AMDGPU_METADATA",), id="no_metadata"),
])
def test_broken_objects_are_refused_naming_file_and_check(built, name, check, fragments):
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # a refusal is an answer, not a warning
    verdict = code_objects.verify_code_object(built[name], nm_entry())
  assert_refused(verdict, built[name], check, *fragments)


def _patched(image: bytes, offset: int, layout: str, value: int) -> bytes:
  data = bytearray(image)
  struct.pack_into(layout, data, offset, value)
  return bytes(data)


@pytest.mark.parametrize("offset, layout, value, check, fragment", [
    pytest.param(4, "<B", 1, "elf-class", "ELFCLASS64", id="elfclass32"),
    pytest.param(5, "<B", 2, "elf-class", "little-endian", id="big_endian"),
    pytest.param(18, "<H", 62, "e_machine", "found e_machine 62", id="x86_64_machine"),
    pytest.param(48, "<I", 0x54F + 0x80, "mach", "found an unknown processor", id="unknown_mach"),
])
def test_patched_header_fields_are_refused(built, tmp_path, offset, layout, value, check,
                                           fragment):
  path = tmp_path / NM_FILE
  path.write_bytes(_patched(built["nm"].read_bytes(), offset, layout, value))
  assert_refused(code_objects.verify_code_object(path, nm_entry()), path, check, fragment)


def _note_section_header_offset(image: bytes) -> int:
  e_shoff = struct.unpack_from("<Q", image, 0x28)[0]
  e_shnum = struct.unpack_from("<H", image, 0x3C)[0]
  for i in range(e_shnum):
    offset = e_shoff + 64 * i
    if struct.unpack_from("<I", image, offset + 4)[0] == amdgpu_elf.SHT_NOTE:
      return offset
  raise AssertionError("the assembled object has no note section")


def test_note_section_past_the_end_is_refused(built, tmp_path):
  image = built["nm"].read_bytes()
  sh_size_at = _note_section_header_offset(image) + 32
  path = tmp_path / NM_FILE
  path.write_bytes(_patched(image, sh_size_at, "<Q", len(image) * 4))
  assert_refused(code_objects.verify_code_object(path, nm_entry()), path, "metadata-note",
                 "truncated")


def test_note_record_longer_than_its_section_is_refused(built, tmp_path):
  image = built["nm"].read_bytes()
  note_offset = struct.unpack_from("<Q", image, _note_section_header_offset(image) + 24)[0]
  path = tmp_path / NM_FILE
  path.write_bytes(_patched(image, note_offset + 4, "<I", 1 << 20))  # descsz
  assert_refused(code_objects.verify_code_object(path, nm_entry()), path, "metadata-note",
                 "truncated")


@pytest.mark.parametrize("cut", [1, 3, 5, 40, 63, 64, 300, 0.5, -64, -1])
def test_truncated_objects_are_refused_clearly(built, tmp_path, cut):
  image = built["nm"].read_bytes()
  length = int(len(image) * cut) if isinstance(cut, float) else cut % len(image)
  path = tmp_path / NM_FILE
  path.write_bytes(image[:length])
  verdict = code_objects.verify_code_object(path, nm_entry())
  assert verdict.status == "refused"
  assert verdict.check in {"elf-magic", "elf-header", "section-headers"}, verdict.message
  assert_refused(verdict, path, verdict.check)
  assert "truncated" in verdict.message or "not an ELF" in verdict.message


def test_empty_file_is_refused(tmp_path):
  path = tmp_path / NM_FILE
  path.write_bytes(b"")
  assert_refused(code_objects.verify_code_object(path, nm_entry()), path, "elf-magic",
                 "empty")


def test_non_elf_file_is_refused(tmp_path):
  path = tmp_path / NM_FILE
  path.write_text("#!/bin/sh\necho this is not a code object\n")
  assert_refused(code_objects.verify_code_object(path, nm_entry()), path, "elf-magic",
                 "not an ELF")


@pytest.mark.parametrize("make", [lambda p: None, lambda p: p.mkdir()],
                         ids=["missing", "directory"])
def test_unreadable_path_is_refused(tmp_path, make):
  path = tmp_path / NM_FILE
  make(path)
  assert_refused(code_objects.verify_code_object(path, nm_entry()), path, "readable")


@hypothesis.settings(max_examples=150, deadline=None,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(data=st.data())
def test_corrupted_bytes_give_a_verdict_never_an_exception(built, data):
  image = bytearray(built["nm"].read_bytes())
  for _ in range(data.draw(st.integers(1, 8))):
    image[data.draw(st.integers(0, len(image) - 1))] = data.draw(st.integers(0, 255))
  length = data.draw(st.integers(0, len(image)))
  verdict = code_objects.verify_image(bytes(image[:length]), "fuzzed.co", nm_entry())
  assert verdict.status in ("verified", "unrecognized-build", "refused")
  assert verdict.status != "refused" or (verdict.check and "fuzzed.co" in verdict.message)


# ------------------------------------------------------------------------------------------------
# The verdict cache


def test_verdicts_are_cached_until_the_file_or_the_dir_changes(built, tmp_path, monkeypatch):
  path = place(built, "nm", tmp_path)
  calls = []
  real_verify = code_objects.verify_image
  monkeypatch.setattr(code_objects, "verify_image",
                      lambda *args: calls.append(args) or real_verify(*args))
  with pytest.warns(code_objects.UnrecognizedCodeObjectWarning):
    first = code_objects.verify_code_object(path, nm_entry())
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # the warning comes once per cached verdict
    assert code_objects.verify_code_object(path, nm_entry()) is first
  assert len(calls) == 1

  stat = path.stat()
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
  with pytest.warns(code_objects.UnrecognizedCodeObjectWarning):
    code_objects.verify_code_object(path, nm_entry())
  assert len(calls) == 2

  code_objects.set_code_object_dir(tmp_path)
  with pytest.warns(code_objects.UnrecognizedCodeObjectWarning):
    code_objects.verify_code_object(path, nm_entry())
  assert len(calls) == 3


# ------------------------------------------------------------------------------------------------
# The search


def _fake_aiter_package(root: Path) -> None:
  """An `aiter` package whose import fails loudly, so a test sees any attempt to import it."""
  package = root / "aiter"
  package.mkdir(parents=True)
  (package / "__init__.py").write_text(
      "raise ImportError('jax_mla must locate aiter without importing it')\n")


def _fake_aiter_wheel_install(built, site: Path) -> Path:
  """aiter laid out as its wheel installs it: site/aiter + site/aiter_meta/hsa/gfx950/mla_v4."""
  _fake_aiter_package(site)
  meta = site / "aiter_meta"
  meta.mkdir()
  (meta / "__init__.py").write_text("raise ImportError('aiter_meta must not be imported')\n")
  return place(built, "nm", meta / "hsa" / "gfx950" / "mla_v4")


def _fake_aiter_checkout(built, repo: Path) -> Path:
  """aiter as a source checkout or editable install: repo/aiter + repo/hsa/gfx950/mla_v4."""
  _fake_aiter_package(repo)
  return place(built, "nm", repo / "hsa" / "gfx950" / "mla_v4")


def test_search_order_set_dir_then_env_var_then_aiter(built, tmp_path, monkeypatch,
                                                      isolated_sys_path):
  set_dir = place(built, "nm", tmp_path / "set").parent
  env_dir = place(built, "nm", tmp_path / "env").parent
  aiter_file = _fake_aiter_wheel_install(built, isolated_sys_path)
  code_objects.set_code_object_dir(set_dir)
  monkeypatch.setenv(code_objects.ENV_VAR, str(env_dir))

  with pytest.warns(code_objects.UnrecognizedCodeObjectWarning):
    found = code_objects.find_code_object(NM_ID)
  assert (found.source, found.path) == ("set_code_object_dir", set_dir.resolve() / NM_FILE)

  code_objects.set_code_object_dir(None)
  with pytest.warns(code_objects.UnrecognizedCodeObjectWarning):
    found = code_objects.find_code_object(NM_ID)
  assert (found.source, found.path) == ("JAX_MLA_HSA_DIR", env_dir / NM_FILE)

  monkeypatch.delenv(code_objects.ENV_VAR)
  with pytest.warns(code_objects.UnrecognizedCodeObjectWarning):
    found = code_objects.find_code_object(NM_ID)
  assert (found.source, found.path.resolve()) == ("aiter", aiter_file.resolve())
  assert "aiter" not in sys.modules and "aiter_meta" not in sys.modules


def test_a_location_without_the_file_is_skipped(built, tmp_path, monkeypatch,
                                                isolated_sys_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  env_dir = place(built, "nm", tmp_path / "env").parent
  code_objects.set_code_object_dir(empty)
  monkeypatch.setenv(code_objects.ENV_VAR, str(env_dir))
  with pytest.warns(code_objects.UnrecognizedCodeObjectWarning):
    assert code_objects.find_code_object(NM_ID).source == "JAX_MLA_HSA_DIR"


def test_aiter_checkout_layout_is_found_without_importing_aiter(built, isolated_sys_path):
  aiter_file = _fake_aiter_checkout(built, isolated_sys_path)
  with pytest.warns(code_objects.UnrecognizedCodeObjectWarning):
    found = code_objects.find_code_object(NM_ID)
  assert (found.source, found.path.resolve()) == ("aiter", aiter_file.resolve())
  assert "aiter" not in sys.modules


def test_nothing_found_lists_every_place_searched(tmp_path, monkeypatch, isolated_sys_path):
  with pytest.raises(code_objects.CodeObjectError) as info:
    code_objects.find_code_object(NM_ID)
  message = str(info.value)
  assert isinstance(info.value, RuntimeError)
  assert "set_code_object_dir: not set" in message
  assert "JAX_MLA_HSA_DIR: not set" in message
  assert "aiter: no aiter package" in message
  assert NM_FILE in message and "hsa/gfx950/mla_v4" in message

  set_dir, env_dir = tmp_path / "set", tmp_path / "env"
  set_dir.mkdir()
  env_dir.mkdir()
  _fake_aiter_package(isolated_sys_path)
  code_objects.set_code_object_dir(set_dir)
  monkeypatch.setenv(code_objects.ENV_VAR, str(env_dir))
  with pytest.raises(code_objects.CodeObjectError) as info:
    code_objects.find_code_object(NM_ID)
  searched = info.value.searched
  assert searched[0] == f"set_code_object_dir: {set_dir.resolve() / NM_FILE}: no such file"
  assert searched[1] == f"JAX_MLA_HSA_DIR: {env_dir / NM_FILE}: no such file"
  aiter_places = [s for s in searched if s.startswith("aiter: ")]
  assert any(str(isolated_sys_path / "aiter_meta" / "hsa") in s for s in aiter_places)
  assert all(s in str(info.value) for s in searched)
  assert "aiter" not in sys.modules


def test_a_refused_file_stops_the_search(built, tmp_path, monkeypatch, isolated_sys_path):
  bad = place(built, "kernarg_320", tmp_path / "set")
  env_dir = place(built, "nm", tmp_path / "env").parent
  code_objects.set_code_object_dir(bad.parent)
  monkeypatch.setenv(code_objects.ENV_VAR, str(env_dir))
  with pytest.raises(code_objects.CodeObjectError) as info:
    code_objects.find_code_object(NM_ID)
  verdict = info.value.verdict
  assert verdict is not None and verdict.check == "kernarg_segment_size"
  assert str(bad.resolve()) in str(info.value) and "stopped" in str(info.value)
  assert not any(s.startswith("JAX_MLA_HSA_DIR") for s in info.value.searched)


def test_set_code_object_dir_rejects_a_non_directory(tmp_path):
  with pytest.raises(NotADirectoryError, match="not a directory"):
    code_objects.set_code_object_dir(tmp_path / "nope")
  assert code_objects.code_object_dir() is None


def test_discover_all_reports_every_kernel(built, tmp_path, isolated_sys_path):
  directory = tmp_path / "hsa"
  place(built, "nm", directory)
  code_objects.set_code_object_dir(directory)
  with pytest.warns(code_objects.UnrecognizedCodeObjectWarning):
    nm, ps = code_objects.discover_all()
  assert (nm.kernel_id, nm.status, nm.source) == (NM_ID, "unrecognized-build",
                                                  "set_code_object_dir")
  assert (ps.kernel_id, ps.status, ps.path) == (PS_ID, "missing", None)
  assert PS_FILE in ps.describe()

  place(built, "nm", directory, PS_FILE)  # the nm kernel under the ps file name
  _, ps = code_objects.discover_all()
  assert ps.status == "refused" and "kernel-in-metadata" in ps.message


def test_load_verified_image_returns_the_verified_bytes(built, tmp_path, isolated_sys_path):
  path = place(built, "nm", tmp_path / "hsa")
  code_objects.set_code_object_dir(path.parent)
  with pytest.warns(code_objects.UnrecognizedCodeObjectWarning):
    assert code_objects.load_verified_image(NM_ID) == built["nm"].read_bytes()


def test_load_verified_image_reverifies_bytes_changed_behind_the_cache(built, tmp_path,
                                                                      isolated_sys_path):
  path = place(built, "nm", tmp_path / "hsa")
  code_objects.set_code_object_dir(path.parent)
  with pytest.warns(code_objects.UnrecognizedCodeObjectWarning):
    code_objects.find_code_object(NM_ID)
  # Same size and mtime, so the cached verdict still matches the (path, size, mtime) key.
  broken = built["kernarg_320"].read_bytes()
  assert len(broken) == path.stat().st_size
  stat = path.stat()
  path.write_bytes(broken)
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  with pytest.raises(code_objects.CodeObjectError, match="kernarg_segment_size"):
    code_objects.load_verified_image(NM_ID)
