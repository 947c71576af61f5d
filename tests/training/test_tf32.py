"""TF32 for fp32 matmuls on Ampere and later, switched on so that every reader of the flag still
answers: inductor before torch 2.13 reads the legacy getters while it compiles, and they raise once
only the new per-backend API has been set (pytorch#166387), which left "auto" training eager."""

import warnings

import pytest
import torch

from headlab.training.distributed import use_tf32_matmuls


@pytest.fixture
def tf32_restored():
    """TF32 off again after the test, through the legacy switch, which leaves both APIs readable."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.backends.cuda.matmul.allow_tf32 = False


def test_tf32_is_on_and_every_getter_inductor_reads_still_answers(tf32_restored, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # an H100
    use_tf32_matmuls(torch.device("cuda", 0))
    matmul = torch.backends.cuda.matmul
    assert matmul.fp32_precision == "tf32"  # the new API, read by inductor from 2.13
    assert matmul.allow_tf32 is True  # the legacy getter inductor reads before 2.13
    assert torch.get_float32_matmul_precision() == "high"  # read by inductor's autotuning cache in 2.13


def test_a_torch_without_the_legacy_switch_gets_the_new_one(tf32_restored, monkeypatch):
    """Should a later torch drop `allow_tf32` (or stop it setting the new switch), TF32 still goes on."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    matmul = type(torch.backends.cuda.matmul)

    def removed(self, name, value):
        if name == "allow_tf32":
            raise AttributeError(name)
        original(self, name, value)

    original = matmul.__setattr__
    monkeypatch.setattr(matmul, "__setattr__", removed)
    use_tf32_matmuls(torch.device("cuda", 0))
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
