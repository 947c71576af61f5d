"""A Hugging Face Hub cache is a place headlab reads but does not own (`headlab.io.places`): laid
out exactly as the Hub lays a download out (models--ORG--NAME/{refs/main, snapshots/<commit>/,
blobs/<sha256>}, every snapshot file a relative link into blobs/), a sharded checkpoint is read
through its links; a ref, a snapshot or a link that leads out of the model's folder of the cache
is refused in one line before anything there is read, and a link to a missing blob names the
cache as incomplete and the file. Built offline here, from a tiny GPT-2 saved in two shards."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import faults
from headlab.analysis.heads import load_heads
from headlab.cli.main import main as cli_main

transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")

COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
NAME = "org/sharded-gpt2"
REPO = "models--org--sharded-gpt2"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny GPT-2 saved as transformers saves it, in two shards with their index."""
    import torch

    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=64,
                                                           n_positions=32))
    model.save_pretrained(str(folder), max_shard_size="40KB")
    assert len(list(folder.glob("model-*.safetensors"))) >= 2 and (folder / "model.safetensors.index.json").exists()
    return folder


def lay_out_as_the_hub(files: Path, cache: Path, name: str = REPO) -> Path:
    return faults.hub_layout(files, cache, name, COMMIT)


@pytest.fixture
def hub(tmp_path, monkeypatch, checkpoint) -> Path:
    """The model's folder in an offline Hub cache holding the sharded checkpoint."""
    for name, value in (("HF_HUB_OFFLINE", True), ("HF_HUB_CACHE", str(tmp_path / "hub"))):
        monkeypatch.setenv(name, str(int(value)) if value is True else value)
        monkeypatch.setattr(huggingface_hub.constants, name, value)
    return lay_out_as_the_hub(checkpoint, tmp_path / "hub")


def refused(capsys, *argv) -> str:
    assert cli_main(["analyze", *map(str, argv)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("headlab: error: "), err
    return err


def test_a_sharded_checkpoint_is_read_through_the_links_of_the_hub_cache(hub, checkpoint):
    snapshot = hub / "snapshots" / COMMIT
    assert all(p.is_symlink() for p in snapshot.iterdir()) and (snapshot / "model.safetensors.index.json").is_symlink()
    through_hub, direct = load_heads(f"hf:{NAME}"), load_heads(checkpoint)
    assert through_hub.label == NAME and (through_hub.n_layers, through_hub.n_heads) == (2, 4)
    for layer in range(2):
        a, b = through_hub.layer(layer), direct.layer(layer)
        for field in dataclasses.fields(a):
            np.testing.assert_array_equal(getattr(a, field.name), getattr(b, field.name))
    assert load_heads(snapshot).n_layers == 2  # the snapshot folder named by path: its repository is the place


def test_a_hub_cache_reached_through_a_link_is_read(hub, tmp_path, monkeypatch):
    """HF_HUB_CACHE naming a link to the cache (a cache moved to a larger disk): the Hub's client
    answers with the resolved path, which is still the model's folder."""
    linked = tmp_path / "linked-hub"
    linked.symlink_to(hub.parent, target_is_directory=True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(linked))
    assert load_heads(f"hf:{NAME}").n_layers == 2


def test_a_ref_naming_a_folder_outside_the_cache_is_refused(hub, capsys, checkpoint, tmp_path):
    shutil.copytree(checkpoint, tmp_path / "outside-snap")  # a readable checkpoint, where the ref leads
    (hub / "refs" / "main").write_text("../../../outside-snap")
    assert (hub / "snapshots" / "../../../outside-snap").resolve() == (tmp_path / "outside-snap").resolve()
    assert "does not hold a commit name" in refused(capsys, f"hf:{NAME}", "--out", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("escape", ["config to /etc/passwd", "chain through blobs", "snapshot folder", "ref link",
                                    "shard to another model", "repository folder"])
def test_a_link_leading_out_of_the_cache_is_refused_before_it_is_read(hub, capsys, checkpoint, tmp_path, escape):
    outside = tmp_path / "outside"
    shutil.copytree(checkpoint, outside)
    snapshot = hub / "snapshots" / COMMIT
    if escape == "config to /etc/passwd":
        (snapshot / "config.json").unlink()
        (snapshot / "config.json").symlink_to("/etc/passwd")
    elif escape == "chain through blobs":  # snapshot -> blobs/<sha> -> outside: the end of the chain counts
        blob = (snapshot / "config.json").resolve()
        blob.unlink()
        blob.symlink_to(outside / "config.json")
    elif escape == "snapshot folder":
        shutil.rmtree(snapshot)
        snapshot.symlink_to(outside, target_is_directory=True)
    elif escape == "ref link":
        (hub / "refs" / "main").unlink()
        (tmp_path / "ref").write_text(COMMIT)
        (hub / "refs" / "main").symlink_to(tmp_path / "ref")
    elif escape == "repository folder":  # models--ORG--NAME itself a link to a whole repository elsewhere
        (tmp_path / "elsewhere").mkdir()
        shutil.move(hub, tmp_path / "elsewhere" / REPO)
        hub.symlink_to(tmp_path / "elsewhere" / REPO, target_is_directory=True)
    else:  # another model's folder in the same cache is not this model's place
        other = lay_out_as_the_hub(checkpoint, hub.parent, "models--org--other")
        shard = sorted(snapshot.glob("model-*.safetensors"))[0]
        target = (other / "snapshots" / COMMIT / shard.name).resolve()
        shard.unlink()
        shard.symlink_to(target)
    err = refused(capsys, f"hf:{NAME}", "--out", tmp_path / "out")
    assert "outside" in err and "root:" not in err


def test_a_link_to_a_missing_blob_names_the_cache_incomplete_and_the_file(hub, capsys, tmp_path):
    blob = (hub / "snapshots" / COMMIT / "config.json").resolve()
    blob.unlink()  # an interrupted download: the link is there, its blob is not
    err = refused(capsys, f"hf:{NAME}", "--out", tmp_path / "out")
    assert "incomplete" in err and "config.json" in err and "no config.json" not in err


def test_a_users_checkpoint_folder_is_read_through_links_that_stay_inside_it(checkpoint, tmp_path, capsys):
    folder = tmp_path / "mine"
    shutil.copytree(checkpoint, folder)
    (folder / "weights").mkdir()
    for shard in folder.glob("model-*.safetensors"):
        os.rename(shard, folder / "weights" / shard.name)
        shard.symlink_to(Path("weights", shard.name))
    assert load_heads(folder).n_layers == 2
    shard = next(folder.glob("model-*.safetensors"))
    shard.unlink()
    shard.symlink_to(checkpoint / shard.name)  # the same bytes, but outside the folder given
    assert "outside" in refused(capsys, folder, "--out", tmp_path / "out")
