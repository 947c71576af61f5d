"""Round 7, issue 45 classes 1 and 5: Hugging Face Hub caches headlab reads but does not own. A
tiny GPT-2 saved in shards is laid out as the Hub lays a download out (tests/faults.py's
`hub_layout`), then bent: links that leave the model's folder of the cache, refs that name
elsewhere, blobs missing, FIFOs, loops. Each must be read (the cache as the Hub writes it) or
refused in one line naming the problem, and nothing outside the cache may be read: every file
planted outside holds a secret that must appear in no output. Run by tools/hostile_round7_io.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import faults

COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def tiny_gpt2(folder: Path) -> Path:
    """A tiny GPT-2 (transformers) saved in at least two shards with their index."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=64,
                                                           n_positions=32))
    model.save_pretrained(str(folder), max_shard_size="40KB")
    return folder


def hub_cases(root: Path, judge):
    """Yields (name, outcome) for each Hub-cache input; `root` is scratch space."""
    import huggingface_hub

    cache, outside = root / "hub", root / "outside"
    outside.mkdir(parents=True)
    secret = judge.secret
    (outside / "secret.txt").write_text(secret)
    (outside / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_head": 4,
                                                     "secret": secret}))
    checkpoint = tiny_gpt2(root / "gpt2")
    shutil.copytree(checkpoint, outside / "model")
    (outside / "model" / "README.md").write_text(secret)
    huggingface_hub.constants.HF_HUB_CACHE, huggingface_hub.constants.HF_HUB_OFFLINE = str(cache), True
    os.environ.update(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    counter = iter(range(1000))

    def model(bend=None) -> tuple[str, Path]:
        """A fresh model folder in the cache, `bend(repo, snapshot)` applied; its hf: name."""
        name = f"case{next(counter)}"
        repo = faults.hub_layout(checkpoint, cache, f"models--org--{name}", COMMIT)
        if bend is not None:
            bend(repo, repo / "snapshots" / COMMIT)
        return f"hf:org/{name}", repo

    def analyze(source, *flags):
        return judge.cli("analyze", source, *flags, "--out", root / "out" / str(next(counter)))

    def relink(path: Path, target) -> None:
        faults.link(path, Path(target))

    def shard(snapshot: Path) -> Path:
        return sorted(snapshot.glob("model-*.safetensors"))[-1]

    # ---- read as the Hub writes it (class 1) ----
    name, repo = model()
    yield "hf: sharded, relative links into blobs/", judge.success(analyze(name))
    name, _ = model(lambda repo, snap: [relink(p, os.path.realpath(p)) for p in sorted(snap.iterdir())])
    yield "hf: sharded, absolute links into blobs/", judge.success(analyze(name))

    def copies(repo, snap):  # what `huggingface-cli download --local-dir` or a copy leaves: no links
        for path in sorted(snap.iterdir()):
            blob = os.path.realpath(path)
            path.unlink()
            shutil.copyfile(blob, path)
    name, _ = model(copies)
    yield "hf: snapshot files as plain copies (no links)", judge.success(analyze(name))
    _, repo = model()
    yield "snapshot folder given by path (links into its repository)", judge.success(
        analyze(repo / "snapshots" / COMMIT))
    linked_cache = root / "linked-hub"
    linked_cache.symlink_to(cache, target_is_directory=True)
    huggingface_hub.constants.HF_HUB_CACHE = str(linked_cache)
    name, _ = model()
    yield "HF_HUB_CACHE itself a link to the cache", judge.success(analyze(name))
    huggingface_hub.constants.HF_HUB_CACHE = str(cache)

    def chained(repo, snap):  # snapshot -> blobs/a -> blobs/b: a chain that stays inside
        blob = Path(os.path.realpath(snap / "config.json"))
        os.rename(blob, blob.with_name("moved"))
        blob.symlink_to("moved")
    name, _ = model(chained)
    yield "a link chain that stays inside the repository", judge.success(analyze(name))

    # ---- leaving the cache (class 5) ----
    def escapes(what: str, bend, *words):
        name, _ = model(bend)
        return what, judge.refusal(analyze(name), *words, escape=True)

    yield escapes("refs/main = ../../../outside", lambda repo, snap: (repo / "refs" / "main").write_text(
        "../../../outside/model"), "commit")
    yield escapes("refs/main = an absolute path", lambda repo, snap: (repo / "refs" / "main").write_text(
        str(outside / "model")), "commit")
    yield escapes("refs/main empty", lambda repo, snap: (repo / "refs" / "main").write_text(""), "commit")
    yield escapes("refs/main a link to a file outside", lambda repo, snap: relink(
        repo / "refs" / "main", outside / "secret.txt"), "outside")
    yield escapes("refs/pr/1 holding ../..", lambda repo, snap: ((repo / "refs" / "pr").mkdir(), (
        repo / "refs" / "pr" / "1").write_text("../../x")), "commit")
    yield escapes("config.json a link to /etc/hostname", lambda repo, snap: relink(snap / "config.json",
                                                                                  "/etc/hostname"), "outside")
    yield escapes("config.json a link to a secret beside the cache", lambda repo, snap: relink(
        snap / "config.json", outside / "config.json"), "outside")
    yield escapes("a shard a link to /dev/zero", lambda repo, snap: relink(shard(snap), "/dev/zero"), "outside")
    yield escapes("blobs/ a link to a folder outside", lambda repo, snap: (
        shutil.copytree(repo / "blobs", outside / f"blobs-{repo.name}"), shutil.rmtree(repo / "blobs"),
        (repo / "blobs").symlink_to(outside / f"blobs-{repo.name}")), "outside")
    yield escapes("snapshot folder a link to a checkpoint outside", lambda repo, snap: (
        shutil.rmtree(snap), snap.symlink_to(outside / "model", target_is_directory=True)), "outside")

    def other_model(repo, snap):  # another model's blob, in the same cache: not this model's place
        _, other = model()
        relink(shard(snap), os.path.realpath(shard(other / "snapshots" / COMMIT)))
    yield escapes("a shard linked to another model's blob in the same cache", other_model, "outside")

    def chain_out(repo, snap):
        blob = Path(os.path.realpath(snap / "model.safetensors.index.json"))
        blob.unlink()
        blob.symlink_to(outside / "secret.txt")
    yield escapes("index -> blobs/<sha> -> a file outside", chain_out, "outside")
    yield escapes("README.md a link to a secret outside", lambda repo, snap: relink(
        snap / "README.md", outside / "secret.txt"), "outside")
    yield escapes("index weight_map naming ../../blobs/<sha>", lambda repo, snap: relink(
        snap / "model.safetensors.index.json", _index(root, snap, lambda f: f"../../blobs/{_blob_of(snap, f)}")),
        "read from a file")
    yield escapes("index weight_map naming /etc/passwd", lambda repo, snap: relink(
        snap / "model.safetensors.index.json", _index(root, snap, lambda f: "/etc/passwd")), "strictly below")

    # ---- an incomplete or odd cache (class 8) ----
    def missing_blob(target: str):
        def bend(repo, snap):
            Path(os.path.realpath(snap / target if target != "shard" else shard(snap))).unlink()
        return bend
    for target in ("config.json", "model.safetensors.index.json", "shard"):
        name, _ = model(missing_blob(target))
        yield f"the blob of {target} missing (an interrupted download)", judge.refusal(analyze(name), "incomplete")

    def fifo_blob(repo, snap):
        blob = Path(os.path.realpath(shard(snap)))
        blob.unlink()
        os.mkfifo(blob)
    name, _ = model(fifo_blob)
    yield "a shard's blob is a FIFO", judge.refusal(analyze(name), "not a regular file")

    def loop(repo, snap):
        (snap / "config.json").unlink()
        (repo / "blobs" / "a").symlink_to("b")
        (repo / "blobs" / "b").symlink_to("a")
        (snap / "config.json").symlink_to("../../blobs/a")
    name, _ = model(loop)
    yield "config.json a link loop inside the cache", judge.refusal(analyze(name), "loop")
    name, _ = model(lambda repo, snap: Path(os.path.realpath(shard(snap))).write_bytes(b"\0" * 9))
    yield "a shard's blob truncated", judge.refusal(analyze(name), "safetensors")
    yield "hf:../escape (a name that is not a Hub name)", judge.refusal(analyze("hf:../escape"), "hf:../escape")


def _blob_of(snapshot: Path, name: str) -> str:
    return Path(os.path.realpath(snapshot / name)).name


def _index(root: Path, snapshot: Path, shard_name) -> Path:
    """A copy of the snapshot's index whose weight_map names each shard as `shard_name(shard)`."""
    index = json.loads((snapshot / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: shard_name(v) for k, v in index["weight_map"].items()}
    path = snapshot.parent.parent / "blobs" / f"edited-index-{abs(hash(str(index))) % 10 ** 8}"
    path.write_text(json.dumps(index))
    return path


def gguf_cases(root: Path, judge):
    """Yields (name, outcome) for GGUF checkpoints under the same rules (after GGUF sources landed):
    in a Hub cache, its .gguf a link into blobs/; a user's folder of .gguf files with links."""
    import sys

    import huggingface_hub

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "analysis"))
    from gguf_fixtures import random_model, write_gguf

    cache, outside = root / "gguf-hub", root / "gguf-outside"
    (root / "gguf").mkdir(parents=True)
    outside.mkdir()
    write_gguf(root / "gguf" / "tiny.gguf", random_model("llama"), "llama")
    shutil.copyfile(root / "gguf" / "tiny.gguf", outside / "tiny.gguf")
    (outside / "secret.txt").write_text(judge.secret)
    huggingface_hub.constants.HF_HUB_CACHE, huggingface_hub.constants.HF_HUB_OFFLINE = str(cache), True
    os.environ.update(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    counter = iter(range(1000))

    def model(bend=None) -> tuple[str, Path]:
        name = f"gguf{next(counter)}"
        repo = faults.hub_layout(root / "gguf", cache, f"models--org--{name}", COMMIT)
        if bend is not None:
            bend(repo / "snapshots" / COMMIT / "tiny.gguf")
        return f"hf:org/{name}", repo / "snapshots" / COMMIT / "tiny.gguf"

    def analyze(source):
        return judge.cli("analyze", source, "--out", root / "gguf-out" / str(next(counter)))

    def users_folder(target) -> Path:
        folder = root / f"mine{next(counter)}"
        folder.mkdir()
        faults.link(folder / "tiny.gguf", Path(target))
        return folder

    name, _ = model()
    yield "hf: a GGUF model, its .gguf a link into blobs/", judge.success(analyze(name))
    _, file = model()
    yield "a Hub snapshot's .gguf named by path", judge.success(analyze(file))
    yield "a folder of .gguf links that stay inside it", judge.success(analyze(_inside_folder(root, counter)))
    for what, target in (("a copy outside the cache", outside / "tiny.gguf"), ("/dev/zero", "/dev/zero"),
                         ("a secret outside", outside / "secret.txt")):
        name, _ = model(lambda gguf, target=target: faults.link(gguf, Path(target)))
        yield f"hf: GGUF, its .gguf a link to {what}", judge.refusal(analyze(name), "outside", escape=True)
    _, file = model(lambda gguf: faults.link(gguf, outside / "tiny.gguf"))
    yield "a Hub snapshot's .gguf named by path, linked outside the cache", judge.refusal(
        analyze(file), "outside", escape=True)
    yield "a user's folder whose .gguf links outside it", judge.refusal(
        analyze(users_folder(outside / "tiny.gguf")), "outside", escape=True)
    yield "a user's folder whose wheel links outside it", judge.refusal(
        analyze(_wheel_folder(root, counter, outside)), "outside", escape=True)
    name, _ = model(lambda gguf: Path(os.path.realpath(gguf)).unlink())
    yield "hf: GGUF, its blob missing (an interrupted download)", judge.refusal(analyze(name), "incomplete")

    def fifo(gguf):
        blob = Path(os.path.realpath(gguf))
        blob.unlink()
        os.mkfifo(blob)
    name, _ = model(fifo)
    yield "hf: GGUF, its blob a FIFO", judge.refusal(analyze(name), "not a regular file")
    name, _ = model(lambda gguf: (faults.link(gguf, gguf.parent / "loop.gguf"), faults.link(
        gguf.parent / "loop.gguf", gguf)))
    yield "hf: GGUF, its .gguf a link loop", judge.refusal(analyze(name), "loop")


def _inside_folder(root: Path, counter) -> Path:
    """A user's folder whose .gguf is a relative link to a file in its own sub-folder."""
    folder = root / f"mine{next(counter)}"
    (folder / "store").mkdir(parents=True)
    shutil.copyfile(root / "gguf" / "tiny.gguf", folder / "store" / "weights.bin")
    (folder / "tiny.gguf").symlink_to("store/weights.bin")
    return folder


def _wheel_folder(root: Path, counter, outside: Path) -> Path:
    """A user's folder of wheels, one a link to a wheel outside it."""
    import zipfile

    wheel = outside / "tiny-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(root / "gguf" / "tiny.gguf", "tiny/tiny.gguf")
    folder = root / f"wheels{next(counter)}"
    folder.mkdir()
    (folder / wheel.name).symlink_to(wheel)
    return folder
