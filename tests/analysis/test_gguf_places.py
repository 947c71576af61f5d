"""A GGUF checkpoint is read under the rules of the places headlab reads but does not own
(`headlab.io.places`), as a safetensors checkpoint is: in a Hub cache laid out as the Hub lays it
out (the .gguf a link into blobs/) it is read through its link, by hf:ORG/NAME or by path; a link
that leads out of the model's folder of the cache, or out of a user's folder of .gguf files, is
refused in one line. A .gguf file named by itself is its own place: a link of the user's own is
followed, as opening it by name would."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from gguf_fixtures import random_model, write_gguf

import faults
from headlab.analysis.heads import load_heads
from headlab.cli.main import main as cli_main

huggingface_hub = pytest.importorskip("huggingface_hub")

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def gguf_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    write_gguf(folder / "tiny.gguf", random_model("llama"), "llama")
    return folder


@pytest.fixture
def hub(tmp_path, monkeypatch, gguf_folder):
    for name, value in (("HF_HUB_OFFLINE", True), ("HF_HUB_CACHE", str(tmp_path / "hub"))):
        monkeypatch.setenv(name, str(int(value)) if value is True else value)
        monkeypatch.setattr(huggingface_hub.constants, name, value)
    return faults.hub_layout(gguf_folder, tmp_path / "hub", "models--org--tiny-gguf", COMMIT)


def same_heads(a, b) -> None:
    assert (a.n_layers, a.n_heads) == (b.n_layers, b.n_heads)
    for layer in range(a.n_layers):
        np.testing.assert_array_equal(a.layer(layer).wq, b.layer(layer).wq)


def test_a_gguf_in_the_hub_cache_is_read_through_its_link(hub, gguf_folder):
    snapshot = hub / "snapshots" / COMMIT
    assert (snapshot / "tiny.gguf").is_symlink()
    direct = load_heads(gguf_folder / "tiny.gguf")
    through_hub = load_heads("hf:org/tiny-gguf")
    assert through_hub.label == "org/tiny-gguf"
    same_heads(through_hub, direct)
    named = load_heads(snapshot / "tiny.gguf")  # the file named by path: its label is its name, not its blob's
    assert named.label == "tiny"
    same_heads(named, direct)


@pytest.mark.parametrize("by", ["hub name", "file path"])
def test_a_gguf_link_leading_out_of_the_hub_cache_is_refused(hub, gguf_folder, tmp_path, capsys, by):
    outside = tmp_path / "outside.gguf"
    shutil.copyfile(gguf_folder / "tiny.gguf", outside)
    link = hub / "snapshots" / COMMIT / "tiny.gguf"
    link.unlink()
    link.symlink_to(outside)  # readable bytes, but not in the model's folder of the cache
    source = "hf:org/tiny-gguf" if by == "hub name" else link
    assert cli_main(["analyze", str(source), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "outside" in err, err
    assert not (tmp_path / "out").exists()


def test_a_users_gguf_folder_is_read_through_links_that_stay_inside_it(gguf_folder, tmp_path, capsys):
    folder = tmp_path / "models"
    (folder / "store").mkdir(parents=True)
    shutil.copyfile(gguf_folder / "tiny.gguf", folder / "store" / "weights.bin")
    (folder / "tiny.gguf").symlink_to("store/weights.bin")
    same_heads(load_heads(folder), load_heads(gguf_folder / "tiny.gguf"))
    (folder / "tiny.gguf").unlink()
    (folder / "tiny.gguf").symlink_to(gguf_folder / "tiny.gguf")
    assert cli_main(["analyze", str(folder), "--out", str(tmp_path / "out")]) == 2
    assert "outside" in capsys.readouterr().err
    mine = tmp_path / "mine.gguf"
    mine.symlink_to(gguf_folder / "tiny.gguf")  # a file named by itself: the user's own link is followed
    same_heads(load_heads(mine), load_heads(gguf_folder / "tiny.gguf"))
