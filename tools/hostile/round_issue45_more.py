"""Issue 45's round over its other classes: fresh hostile inputs (in none of the earlier lists)
for 4 (runs that never learned, comparisons of unequal runs), 6 (settings that say more than they
do), 7 (undefined values), 9 (the previous release reading today's runs) and 8 as `analyze` meets
it: GGUF files that are cut or lie, wheels without a model, split packages whose hashes do not
add up, and `--text` files that are not text. A bad input must be refused in one line naming what
is wrong; a valid one must do what it says."""

from __future__ import annotations

import hashlib
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

from hostile.cases import Case, either, refusal, run_cases, success
from hostile.harness import cli, recorder
from hostile.round_issue45_io import PLACE, mqa_run, template
from hostile.round_issue45_study import PREVIOUS_RELEASE, ROOT, kill_layer, study_runs, swap_snapshot, tabulated

from headlab import load_corpus, preset, train, train_preset
from headlab.study.study import StudyRun

NAME = "issue45_more"
REPRODUCE = ["reproduce", "--preset", "tiny", "--corpus", "synthetic", "--steps", "4", "--seeds", "1", "--jobs", "1"]
SWEEP = ["sweep", "--preset", "tiny", "--lengths", "0.1", "--seeds", "1", "--jobs", "1", "--only", "mha", "mqa"]


def reproduce_refused(*flags_and_words):
    flags, words = flags_and_words

    def inflict(folder):
        out = folder / "study"
        outcome = refusal(cli(*REPRODUCE, *flags, "--out", out, seconds=900), *words)
        return outcome if not (out / "report.md").exists() else ("silent", "a report was written")
    return inflict


def sweep_refused(setting: str, word: str):
    return lambda folder: refusal(cli(*SWEEP, "--set", setting, "--out", folder / "sweep", seconds=900), word)


# ---- 4: unequal runs given to tabulate_study ------------------------------------------------------

def api_runs(folder: Path, role: str, seed: int = 0, **training) -> StudyRun:
    run = StudyRun(role, preset("tiny", role), seed, folder / f"{role}-{seed}")
    config = train_preset("tiny", steps=4, seed=seed, **training)
    train(run.config, config, load_corpus("synthetic"), out=run.folder, progress=False)
    return run


def tabulate_refused(make_runs, *words):
    def inflict(folder):
        from hostile.harness import api
        return refusal(api(tabulated(make_runs(folder), folder / "tables")), *words)
    return inflict


def disjoint_seeds(folder):
    return [api_runs(folder, "mha", 0), api_runs(folder, "mqa", 1)]


def half_trained(folder):
    """An MQA run stopped after its step-2 checkpoint (what a kill leaves: resumable, unfinished)."""
    mqa = StudyRun("mqa", preset("tiny", "mqa"), 0, folder / "mqa-0")
    train(mqa.config, train_preset("tiny", steps=2), load_corpus("synthetic"), out=mqa.folder, progress=False)
    return [api_runs(folder, "mha", 0), mqa]


def scaled_step0(folder):
    """Step-0 snapshot replaced by itself times 1.001, its hash listed anew."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from headlab.runs.snapshots import snapshot_name
    runs = [api_runs(folder, "mha", 0, snapshot_every=2), api_runs(folder, "mqa", 0, snapshot_every=2)]
    source, scaled = runs[0].folder / snapshot_name(0), folder / "scaled" / snapshot_name(0)
    scaled.parent.mkdir(parents=True)
    with safe_open(str(source), framework="pt") as weights:
        metadata = weights.metadata()
    save_file({k: v * 1.001 for k, v in load_file(str(source)).items()}, str(scaled), metadata=metadata)
    swap_snapshot(folder / "scaled", runs[0].folder)
    return runs


# ---- 7: undefined layers --------------------------------------------------------------------------

def dead_layer_one_seed(folder):
    from hostile.harness import api

    from headlab.report.writer import write_report
    study, runs = study_runs(folder / "dead", seeds=1)
    kill_layer(next(r for r in runs if r.role == "mha").folder, 0)
    report = study.folder / "report.md"
    return success(api(lambda: write_report(tabulated(runs, study.folder)(), study.folder)),
                   lambda: not re.search(r"\bnan\b", report.read_text()) and "undefined" in report.read_text(),
                   "no nan in the report, MHA's layer 0 named undefined")


# ---- 9: the previous release ---------------------------------------------------------------------

def previous_release_reads(model_role: str, **training):
    def inflict(folder):
        archive = subprocess.run(["git", "archive", PREVIOUS_RELEASE, "headlab"], cwd=ROOT, capture_output=True)
        if archive.returncode:
            return "clear", f"no release {PREVIOUS_RELEASE} in this clone"
        (folder / "release").mkdir()
        subprocess.run(["tar", "-x", "-C", str(folder / "release")], input=archive.stdout, check=True)
        run = folder / "run"
        train(preset("tiny", model_role), train_preset("tiny", steps=2, eval_every=2, checkpoint_every=2, **training),
              load_corpus("synthetic"), out=run, progress=False)
        done = subprocess.run([sys.executable, "-c", "import sys; from headlab import load_run; load_run(sys.argv[1])",
                               str(run)], capture_output=True, text=True, cwd=folder / "release", timeout=600,
                              env={**os.environ, "PYTHONPATH": str(folder / "release")})
        said = (done.stderr.strip().splitlines() or [""])[-1]
        if done.returncode == 0:
            return "OK", "read"
        fields = [f for f in training if f in said]
        return ("clear", said[:200]) if fields and "newer" in said.lower() else ("silent", f"not read: {said[:180]}")
    return inflict


# ---- 8: GGUF files, wheels and split packages, --text ---------------------------------------------

def gguf_file(folder: Path, **config) -> Path:
    """A tiny llama GGUF (tests/analysis/gguf_fixtures.py), its config first changed by `config` (a lie)."""
    sys.path.insert(0, str(ROOT / "tests" / "analysis"))
    from gguf_fixtures import random_model, write_gguf
    model = random_model("llama")
    for key, value in config.items():
        setattr(model.config, key, value)
    return write_gguf(folder / "model.gguf", model, "llama")


def analyze(source, folder: Path, *flags, seconds: int = 120):
    return cli("analyze", source, *flags, "--no-figure", "--out", folder / "out", seconds=seconds)


def edited_gguf(edit, *words):
    def inflict(folder):
        path = gguf_file(folder)
        data = bytearray(path.read_bytes())
        path.write_bytes(bytes(edit(data)))
        return refusal(analyze(path, folder), *words)
    return inflict


def at(offset: int, fmt: str, value):
    def edit(data: bytearray) -> bytearray:
        struct.pack_into(fmt, data, offset, value)
        return data
    return edit


def lying_gguf(key: str, value, *words):
    return lambda folder: refusal(analyze(gguf_file(folder, **{key: value}), folder), *words)


def wheel(path: Path, files: dict[str, bytes]) -> Path:
    """A wheel holding `files`, its RECORD stating their SHA-256 (tests/analysis/test_gguf_packages.py's)."""
    sys.path.insert(0, str(ROOT / "tests" / "analysis"))
    from test_gguf_packages import wheel as packaged
    return packaged(path, files)


def split_wheels(folder: Path, first: int = 0, sums_name: str = "model.gguf") -> Path:
    data = gguf_file(folder).read_bytes()
    packages = folder / "packages"
    packages.mkdir()
    size = -(-len(data) // 2)
    for i in range(2):
        wheel(packages / f"part{i}-1.0-py3-none-any.whl",
              {f"part{i}/data/model.gguf.part{first + i:02d}": data[i * size:(i + 1) * size]})
    wheel(packages / "main-1.0-py3-none-any.whl",
          {"main/data/SHA256SUMS": f"{hashlib.sha256(data).hexdigest()}  {sums_name}\n".encode()})
    return packages


def no_gguf_wheel(folder):
    source = wheel(folder / "empty-1.0-py3-none-any.whl", {"empty/__init__.py": b"", "empty/README.md": b"no model"})
    return refusal(analyze(source, folder), "gguf")


def not_a_zip_wheel(folder):
    (folder / "fake-1.0-py3-none-any.whl").write_text("this is not a zip archive")
    return refusal(analyze(folder / "fake-1.0-py3-none-any.whl", folder), "fake-1.0-py3-none-any.whl")


def gguf_to_zero(folder):
    (folder / "zero.gguf").symlink_to("/dev/zero")
    return refusal(analyze(folder / "zero.gguf", folder, seconds=90), "zero.gguf")


def text_input(make, *words, expect="refused"):
    """analyze --measure data of the template's MQA run on the --text `make(folder)` returns."""
    def inflict(folder):
        text = make(folder)
        outcome = analyze(mqa_run(template() / "study"), folder, "--measure", "data", "--text", text, seconds=90)
        return refusal(outcome, *words) if expect == "refused" else either(outcome)
    return inflict


def fifo_text(folder):
    os.mkfifo(folder / "text.fifo")
    return folder / "text.fifo"


def written(name: str, data: bytes):
    def make(folder):
        (folder / name).write_bytes(data)
        return folder / name
    return make


CASES = [Case(cls, name, inflict) for cls, name, inflict in [
    ("4", "reproduce --set lr=0", reproduce_refused(["--only", "mha", "mqa", "--set", "lr=0"], ["lr"])),
    ("4", "reproduce --set lr=-0.003", reproduce_refused(["--only", "mha", "mqa", "--set", "lr=-0.003"], ["lr"])),
    ("4", "reproduce --set lr=1e-7", reproduce_refused(["--only", "mha", "mqa", "--set", "lr=1e-7"],
                                                      ["learned nothing"])),
    ("4", "tabulate_study: MHA of seed 0 beside MQA of seed 1", tabulate_refused(disjoint_seeds, "seed")),
    ("4", "tabulate_study: an MQA run stopped at step 2 of 4", tabulate_refused(half_trained, "step")),
    ("4", "tabulate_study: step-0 snapshot scaled by 1.001, re-hashed", tabulate_refused(
        scaled_step0, "is not the step-0 weights")),
    ("6", "reproduce --set muon_qk=false under AdamW", reproduce_refused(
        ["--only", "mha", "mqa", "--set", "muon_qk=false"], ["muon_qk"])),
    ("6", "reproduce --set lrkv_b_optimizer=muon under AdamW", reproduce_refused(
        ["--only", "mha", "lrkv-small", "--set", "lrkv_b_optimizer=muon"], ["lrkv_b_optimizer"])),
    ("6", "sweep --set log_every=1,2", sweep_refused("log_every=1,2", "log_every")),
    ("6", "sweep --set checkpoint_every=2,4", sweep_refused("checkpoint_every=2,4", "checkpoint_every")),
    ("6", "train --compile ' '", lambda folder: refusal(cli(
        "train", "--preset", "tiny", "--corpus", "synthetic", "--steps", "1", "--compile", " ", "--out",
        folder / "run"), "compile")),
    ("7", "report of a one-seed study whose MHA layer 0 has no circuit", dead_layer_one_seed),
    ("9", "previous release reads today's run with snapshot_every=2", previous_release_reads("mla", snapshot_every=2)),
    ("9", "previous release reads today's MQA run with grad_accum=2", previous_release_reads("mqa", grad_accum=2)),
    ("8", "analyze a .gguf cut to its first 24 bytes", edited_gguf(lambda d: d[:24], "model.gguf")),
    ("8", "analyze a .gguf of 0 bytes", edited_gguf(lambda d: d[:0], "model.gguf")),
    ("8", "analyze a .gguf whose tensor count is 2^64-1", edited_gguf(at(8, "<Q", 2 ** 64 - 1), "model.gguf")),
    ("8", "analyze a .gguf whose metadata count is 2^63", edited_gguf(at(16, "<Q", 2 ** 63), "model.gguf")),
    ("8", "analyze a .gguf of version 99", edited_gguf(at(4, "<I", 99), "model.gguf")),
    ("8", "analyze a .gguf whose head count says 8 for 4 heads' tensors",
     lying_gguf("num_attention_heads", 8, "head")),
    ("8", "analyze a .gguf whose block count says 3 for 2 layers' tensors",
     lying_gguf("num_hidden_layers", 3, "blk.2")),
    ("8", "analyze a wheel holding no .gguf", no_gguf_wheel),
    ("8", "analyze a .whl that is not a zip archive", not_a_zip_wheel),
    ("8", "analyze split wheels whose SHA256SUMS names another file",
     lambda folder: refusal(analyze(split_wheels(folder, sums_name="other.gguf"), folder), "SHA256SUMS")),
    ("8", "analyze split wheels numbered from part01", lambda folder: refusal(
        analyze(split_wheels(folder, first=1), folder), "part 00")),
    ("8", "analyze a .gguf that is a link to /dev/zero", gguf_to_zero),
    ("8", "analyze --text a FIFO", text_input(fifo_text, "text.fifo")),
    ("8", "analyze --text /dev/zero", text_input(lambda folder: Path("/dev/zero"), "/dev/zero")),
    ("8", "analyze --text of invalid UTF-8", text_input(written("latin.txt", "café".encode("latin-1") * 200),
                                                       "UTF-8")),
    ("8", "analyze --text of an empty file", text_input(written("empty.txt", b""), "empty.txt")),
    ("8", "analyze --text a folder", text_input(lambda folder: folder, "text")),
    ("8", "analyze --text of one character", text_input(written("one.txt", b"a"), expect="either")),
]]


def run(root: Path) -> list[tuple[str, str, str]]:
    results = []
    PLACE["root"] = root / "issue45"
    run_cases(CASES, PLACE["root"] / NAME, recorder(results, width=72))
    return results
