"""The previous release reads today's runs: config.json names a field added since that release
only where a run sets it away from its default, and a run that does set one (or that a newer
headlab wrote) is refused in one line saying it needs a newer headlab.

The previous release is headlab at 91a3e0b, taken from this checkout's git history into a
temporary folder and run in a subprocess on a run folder today's code writes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from headlab import load_corpus, load_run, preset, train, train_preset
from headlab.model.config import RELEASED_FIELDS, ModelConfig
from headlab.training.config import RELEASED_TRAIN_FIELDS, TrainConfig
from shared_fixtures import tiny_model, write_run

PREVIOUS_RELEASE = "91a3e0b"
ROOT = Path(__file__).resolve().parents[2]
READ = """
import hashlib, json, sys
from headlab import load_run
for folder in sys.argv[1:]:  # one line per run: what it reads, or the error it gives
    try:
        run = load_run(folder)
    except ValueError as error:
        print(json.dumps({"error": str(error)}))
        continue
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for _, t in sorted(run.model.state_dict().items())))
    print(json.dumps({"step": run.step, "model": run.model_config.to_dict(), "attention": run.model_config.attention,
                      "lr": run.train_config.lr, "compile": run.train_config.compile, "weights": digest.hexdigest()}))
"""


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory) -> Path:
    """headlab's package as released at `PREVIOUS_RELEASE`, unpacked into a folder (skips the test
    where the checkout has no such history: a shallow clone, an installed wheel)."""
    archive = subprocess.run(["git", "archive", PREVIOUS_RELEASE, "headlab"], cwd=ROOT, capture_output=True)
    if archive.returncode:
        pytest.skip(f"no git history with {PREVIOUS_RELEASE} here: {archive.stderr.decode().strip()[:100]}")
    folder = tmp_path_factory.mktemp("previous-release")
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def read_with_previous_release(release: Path, *runs: Path) -> list[dict]:
    """What headlab's previous release (`release`) reads of each run folder: one dict per run."""
    environment = {**os.environ, "PYTHONPATH": str(release)}
    read = subprocess.run([sys.executable, "-c", READ, *map(str, runs)], capture_output=True, text=True, cwd=release,
                          env=environment, timeout=300)
    assert read.returncode == 0, read.stderr[-600:]
    return [json.loads(line) for line in read.stdout.strip().splitlines()]


def weights_digest(run) -> str:
    return hashlib.sha256(b"".join(t.numpy().tobytes() for _, t in sorted(run.model.state_dict().items()))).hexdigest()


def test_the_previous_release_reads_a_run_written_today(tmp_path, previous_release):
    """A run at the defaults of every field added since is read as today's code reads it; one
    that uses such a field (arch nanochat) is refused there in one line naming the field, not
    read as another model."""
    short = train_preset("tiny", steps=2, eval_every=2, checkpoint_every=2)
    folders = {"mla": tmp_path / "mla", "nanochat": tmp_path / "nanochat"}
    train(preset("tiny", "mla"), short, load_corpus("synthetic"), out=folders["mla"], progress=False)
    train(preset("tiny", "mha", arch="nanochat"), short, load_corpus("synthetic"), out=folders["nanochat"],
          progress=False)
    then, refused = read_with_previous_release(previous_release, *folders.values())
    today = load_run(folders["mla"])
    assert then["step"] == today.step == 2 and then["attention"] == "mla"
    assert then["model"] == {k: v for k, v in today.model_config.to_dict().items() if k in RELEASED_FIELDS}
    assert then["weights"] == weights_digest(today) and then["lr"] == today.train_config.lr
    assert then["compile"] is False  # "off", as that release's switch
    assert "arch" in refused["error"]


def test_config_json_names_new_fields_only_where_set():
    model, training = preset("tiny", "mha"), train_preset("tiny")
    assert set(model.recorded()) == set(RELEASED_FIELDS)
    assert set(training.recorded()) == set(RELEASED_TRAIN_FIELDS)
    assert model.replace(arch="nanochat").recorded()["arch"] == "nanochat"
    muon = training.replace(optimizer="muon", muon_qk=False, checkpoint_minutes=5.0, compile="aot_eager").recorded()
    assert (muon["muon_qk"], muon["checkpoint_minutes"], muon["compile"]) == (False, 5.0, "aot_eager")
    for config in (model, model.replace(arch="nanochat")):  # what is recorded reads back as the same config
        assert ModelConfig.from_dict(config.recorded()) == config
    for config in (training, training.replace(compile="auto"), training.replace(optimizer="muon", muon_qk=False)):
        assert TrainConfig.from_dict(config.recorded()) == config


@pytest.mark.parametrize("section", ["model", "train"])
def test_a_run_of_a_newer_headlab_is_refused_in_one_line(tmp_path, section):
    config = {"train": {**train_preset("tiny").recorded(), "future_option": 1}} if section == "train" else {}
    folder = write_run(tmp_path / "run", tiny_model("mha"), **({"future_field": 2} if section == "model" else {}))
    if config:  # a train section beside the model's, as the trainer writes it
        from headlab.runs.layout import run_manifest
        manifest = run_manifest(folder)
        payload = json.loads(manifest.read_bytes("config.json"))
        manifest.write_bytes("config.json", json.dumps({**payload, **config, "headlab_version": "9.0"}).encode())
        manifest.save()
    with pytest.raises(ValueError, match="needs a newer headlab") as refused:
        load_run(folder)
    assert ("future_option" if config else "future_field") in str(refused.value)
    assert "\n" not in str(refused.value)
