"""Under torchrun one rank per node (local rank 0) hashes the token cache and a checkpoint to resume,
and the others take its verdict: 2 gloo ranks of one node, counting which rank hashes what. A
damaged file is refused on both ranks, each ending with one line (rank 1's names rank 0's error)."""

import pytest
import torch

from headlab import preset
from headlab.data import shards
from headlab.data.corpus import load_corpus
from headlab.io import manifest as manifest_module
from headlab.runs.checkpoints import current_checkpoint
from headlab.training.config import train_preset
from headlab.training.processes import FailedOnAnotherRank
from headlab.training.trainer import prepared_corpus, train
from ranks import on_ranks

SMALL = 20_000  # characters of the synthetic corpus whose cache the token tests build


def _flip_a_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _corpus_on_rank(rank: int) -> tuple[int, str | None, int]:
    """(shard files hashed by this rank, the corpus's identity and size) of the synthetic corpus prepared
    as `headlab train` prepares it."""
    hashed, digest = [0], shards.file_digest

    def counted(path):
        hashed[0] += 1
        return digest(path)

    shards.file_digest = counted  # a forked rank: its own copy of the module
    corpus = prepared_corpus(lambda: load_corpus("synthetic", n_chars=SMALL), "cpu")
    return hashed[0], corpus.sha256, corpus.n_train_tokens


@pytest.fixture
def token_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    return load_corpus("synthetic", n_chars=SMALL)  # tokenized here once: the ranks find it in their node's cache


def test_the_token_cache_is_hashed_by_one_rank_per_node(token_cache):
    (hashed_0, *corpus_0), (hashed_1, *corpus_1) = on_ranks(_corpus_on_rank, timeout=60)
    files = len(list(token_cache.folder.glob("*.bin")))
    assert (hashed_0, hashed_1) == (files, 0)
    assert corpus_0 == corpus_1 == [token_cache.sha256, token_cache.n_train_tokens]


def test_a_damaged_token_cache_is_refused_on_every_rank_with_one_line(token_cache):
    _flip_a_byte(sorted(token_cache.folder.glob("train_*.bin"))[0])
    own, peer = on_ranks(_corpus_on_rank, timeout=60)
    assert isinstance(own, AssertionError) and isinstance(peer, AssertionError)
    own, peer = str(own), str(peer)
    assert own.startswith("ValueError: ") and "The token cache is damaged" in own and "\n" not in own
    assert peer == f"{FailedOnAnotherRank.__name__}: {own.removeprefix('ValueError: ')} (on rank 0)"


def _resumed_on_rank(out):
    """Resume the finished run in `out` on this rank; the checkpoint files it hashed, and its weights."""
    manifest = manifest_module.Manifest
    hashed, read_bytes, opened, verify = [], manifest.read_bytes, manifest.opened, manifest.verify

    def counted_read(self, name, verify=True):
        hashed.extend([name] if verify else [])
        return read_bytes(self, name, verify)

    def counted_opened(self, name, verify=True):
        hashed.extend([name] if verify else [])
        return opened(self, name, verify)

    def counted_verify(self, name):
        hashed.append(name)
        return verify(self, name)

    manifest.read_bytes, manifest.opened, manifest.verify = counted_read, counted_opened, counted_verify
    run = train(preset("tiny", "mha"), _config(), "synthetic", out=out, resume=True, progress=False)
    return [name for name in hashed if name.startswith("checkpoint-")], run.model.state_dict()


def _config():
    return train_preset("tiny", steps=2, eval_every=2, checkpoint_every=2, device="cpu")


@pytest.fixture
def finished_run(tmp_path):
    run = train(preset("tiny", "mha"), _config(), "synthetic", out=tmp_path / "run", progress=False)
    return tmp_path / "run", run.model.state_dict()


def test_a_checkpoint_to_resume_is_hashed_by_one_rank_per_node(finished_run):
    out, weights = finished_run
    checkpoint = current_checkpoint(out)
    (hashed_0, weights_0), (hashed_1, weights_1) = on_ranks(lambda rank: _resumed_on_rank(out), timeout=60)
    assert sorted(hashed_0) == sorted([checkpoint.state, checkpoint.weights]) and hashed_1 == []
    for resumed in (weights_0, weights_1):
        assert all(torch.equal(resumed[k], weights[k]) for k in weights)


def test_a_damaged_checkpoint_is_refused_on_every_rank_with_one_line(finished_run):
    out, _ = finished_run
    _flip_a_byte(current_checkpoint(out).folder / "model.safetensors")
    own, peer = on_ranks(lambda rank: _resumed_on_rank(out), timeout=60)
    assert isinstance(own, AssertionError) and isinstance(peer, AssertionError)
    own, peer = str(own), str(peer)
    assert own.startswith("ValueError: ") and "model.safetensors" in own and "\n" not in own
    assert peer == f"{FailedOnAnotherRank.__name__}: {own.removeprefix('ValueError: ')} (on rank 0)"
