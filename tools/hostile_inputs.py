"""Hostile inputs and faults against headlab's CLI and API, each outcome classified.

    PYTHONPATH=. python tools/hostile_inputs.py [--out /tmp/hostile]

The faults (links, swaps, truncations, manifest edits, a full disk, kill -9) are tests/faults.py's,
the same the tree-diff test (tests/disk/test_treediff.py) inflicts. Issue 28's classes (confinement,
writes outside the writer, a failed rewrite, identity and reuse, the sweep's grid, unbounded
inputs, error paths) are generators of members, one function each.

Every case is a bad input (which must be refused with one clear line, exit status 2 on the
CLI), or a fault (kill -9, full disk, a second writer) after which the run must resume to the
uninterrupted result. Outcomes:

    clear       refused: one line naming the problem (CLI: exit 2, no traceback)
    recovered   a fault the run survived: resumed to bit-identical weights and metrics
    traceback   an exception escaped, or the CLI printed a traceback
    silent      a bad input was accepted, or a result is wrong without any error
    lost        a fault left a run that cannot be resumed or loaded, or headlab changed or
                deleted something it did not write (a foreign folder, a link's target)
    hang        no answer within HANG_S seconds
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import save_file

from headlab import ModelConfig, TrainConfig, load_corpus, load_run, preset, train, train_preset
from headlab.analysis.similarity import Analysis, analyze
from headlab.cli.main import main
from headlab.io import HashingFile
from headlab.model.gpt import GPT
from headlab.runs.checkpoints import current_checkpoint
from headlab.runs.layout import MANIFEST, run_manifest
from headlab.runs.metrics import read_metrics

try:
    import faults
except ImportError:  # run as a script: the faults the tree-diff test inflicts live in tests/
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import faults

TINY = train_preset("tiny", steps=8, batch_size=4, eval_every=4, checkpoint_every=2, log_every=1)
TINY_FLAGS = ["--steps", "8", "--batch-size", "4", "--eval-every", "4", "--checkpoint-every", "2", "--log-every", "1"]
USER_ERRORS = (ValueError, RuntimeError, OSError)
HANG_S = 120


class Hang(BaseException):
    pass


@contextlib.contextmanager
def deadline(seconds: int = HANG_S):
    """Raise `Hang` in this process if the block runs longer than `seconds` (a FIFO, a lock)."""
    def expire(signum, frame):
        raise Hang(f"no answer within {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def cli(*argv) -> tuple[str, str]:
    """Run `headlab argv` in this process; classify by exit status and stderr."""
    err, out = io.StringIO(), io.StringIO()
    try:
        with deadline(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse: usage and one error line, status 2
        code = exit_.code
    except Hang as error:
        return "hang", str(error)
    except BaseException as error:  # any escape is what is being counted
        return "traceback", f"{type(error).__name__}: {error}"[:200]
    text = err.getvalue().strip()
    if code == 2 and "Traceback" not in text and text.splitlines()[-1].count("error:") == 1:
        return "clear", text.splitlines()[-1][:200]
    return ("silent" if code == 0 else "traceback"), text[-200:]


def api(make) -> tuple[str, str]:
    try:
        with deadline():
            make()
    except Hang as error:
        return "hang", str(error)
    except USER_ERRORS as error:
        return "clear", f"{type(error).__name__}: {error}"[:200]
    except BaseException as error:
        return "traceback", f"{type(error).__name__}: {error}"[:200]
    return "silent", "accepted"


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry below `folder` (and `folder` itself when a file): content hash or link target."""
    paths = sorted(folder.rglob("*")) if folder.is_dir() and not folder.is_symlink() else [folder]
    return {str(p): f"-> {os.readlink(p)}" if p.is_symlink() else "folder" if p.is_dir()
            else hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def untouched(case, *watched: Path) -> tuple[str, str]:
    """The outcome of `case()`, or 'lost' if it changed any of `watched` (what headlab did not write)."""
    before = [snapshot(w) for w in watched]
    outcome = case()
    changed = [str(w) for w, earlier in zip(watched, before) if snapshot(w) != earlier]
    return ("lost", f"changed {', '.join(changed)}") if changed else outcome


def same_run(folder: Path, reference) -> tuple[str, str]:
    try:
        loaded = load_run(folder)
        metrics = read_metrics(folder / "metrics.jsonl")
    except BaseException as error:
        return "lost", f"{type(error).__name__}: {error}"[:200]
    strip = lambda records: [{k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")} for r in records]
    same = all(torch.equal(t, loaded.model.state_dict()[n]) for n, t in reference.model.state_dict().items())
    return ("recovered", "identical") if same and strip(metrics) == strip(reference.metrics) else ("silent", "differs")


def main_cases(root: Path) -> list[tuple[str, str, str]]:
    results = []

    def record(name, outcome):
        results.append((name, *outcome))
        print(f"{outcome[0]:<10} {name:<52} {outcome[1][:110]}", flush=True)

    corpus = load_corpus("synthetic")
    reference = train(preset("tiny", "gqa"), TINY, corpus, out=root / "reference", progress=False)
    finished = root / "finished"
    train(preset("tiny", "gqa"), TINY, corpus, out=finished, progress=False)

    def copy_of_finished(name: str) -> Path:
        target = root / name
        shutil.copytree(finished, target)
        return target

    def checkpoint_file(folder: Path, name: str) -> Path:
        return current_checkpoint(folder).folder / name

    # ---- info ------------------------------------------------------------------------------------
    for args in (["--context", "-5"], ["--context", "0"], ["--context", "abc"], ["--batch-size", "0"],
                 ["--batch-size", "-1"], ["--attention", "lrkv", "--kv-rank", "200"], ["--kv-rank", "0"],
                 ["--attention", "gqa", "--n-kv-head", "5"], ["--n-kv-head", "0"], ["--seq-len", "0"],
                 ["--attention", "mla", "--rope-head-dim", "3"], ["--q-latent-dim", "-1"], ["--dtype", "fp8"],
                 ["--preset", "nope"], ["--attention", "xyz"]):
        record("info " + " ".join(args), cli("info", *args))
    configs = {"missing": None, "list": "[1, 2]", "not-json": "{model", "unknown-field": '{"bogus": 1}',
               "nan-rope": '{"rope_base": NaN}', "zero-heads": '{"n_head": 0}', "negative-vocab": '{"vocab_size": -1}',
               "bool-layers": '{"n_layer": true}', "string-width": '{"d_model": "128"}'}
    for name, text in configs.items():
        path = root / f"config-{name}.json"
        if text is not None:
            path.write_text(text)
        record(f"info --config <{name}>", cli("info", "--config", path))

    # ---- train -----------------------------------------------------------------------------------
    base = ["train", "--preset", "tiny", "--corpus", "synthetic", "--steps", "2", "--no-progress"]
    for args in (["--steps", "0"], ["--steps", "-3"], ["--lr", "nan"], ["--lr", "-1"], ["--lr", "inf"],
                 ["--batch-size", "0"], ["--warmup-steps", "-1"], ["--eval-every", "0"], ["--checkpoint-every", "0"],
                 ["--log-every", "0"], ["--seed", "-1"], ["--optimizer", "sgd"], ["--dtype", "fp16"],
                 ["--device", "gpu0"], ["--corpus", "nope"], ["--max-chars", "100"], ["--encoding-errors", "replace"],
                 ["--tokenizer", "bpe"], ["--seq-len", "1000000"]):
        record("train " + " ".join(args), cli(*base, *args))
    if not torch.cuda.is_available():
        record("train --device cuda (no CUDA)", cli(*base, "--device", "cuda"))
    (root / "empty.txt").write_text("")
    (root / "short.txt").write_text("too short")
    (root / "latin1.txt").write_bytes("naïve café ".encode("latin-1") * 200)
    (root / "no-texts").mkdir()
    for name in ("empty.txt", "short.txt", "latin1.txt", "no-texts"):
        record(f"train --corpus <{name}>", cli(*base, "--corpus", root / name))
    (root / "a-file").write_text("")
    record("train --out <under a file>", cli(*base, "--out", root / "a-file" / "run"))
    record("train --out <finished run> (no --resume)", cli(*base, "--steps", "8", "--out", finished))
    tiny_run = ["train", "--preset", "tiny", "--attention", "gqa", "--corpus", "synthetic", "--no-progress", "--resume",
                *TINY_FLAGS]
    record("train --resume with another --lr", cli(*tiny_run, "--lr", "0.01", "--out", copy_of_finished("lr")))
    record("train --resume with another attention",
           cli(*tiny_run, "--attention", "mha", "--out", copy_of_finished("att")))
    (root / "other.txt").write_text("another corpus entirely. " * 2000)
    record("train --resume on another corpus",
           cli(*tiny_run, "--corpus", root / "other.txt", "--out", copy_of_finished("corp")))
    record("train --resume, same settings (control)",
           ("recovered", "resumed") if cli(*tiny_run, "--out", copy_of_finished("same"))[0] == "silent"
           else ("silent", "a valid resume was refused"))
    folder = copy_of_finished("metrics")
    lines = (folder / "metrics.jsonl").read_text().splitlines(keepends=True)
    (folder / "metrics.jsonl").write_text("".join(lines[:3] + ["{broken\n"] + lines[3:]))
    record("train --resume, corrupt metrics line", api(lambda: load_run(folder)))
    for name, damage in (("config.json not JSON", lambda f: (f / "config.json").write_text("{")),
                         ("config.json a list", lambda f: (f / "config.json").write_text("[]")),
                         ("manifest.json corrupt", lambda f: (f / MANIFEST).write_text("{")),
                         ("weights truncated",
                          lambda f: checkpoint_file(f, "model.safetensors").write_bytes(b"x" * 10)),
                         ("state.pt deleted", lambda f: checkpoint_file(f, "state.pt").unlink()),
                         ("weights deleted", lambda f: checkpoint_file(f, "model.safetensors").unlink())):
        folder = copy_of_finished(name.replace(" ", "-"))
        damage(folder)
        record(f"train --resume, {name}", api(lambda: train(preset("tiny", "gqa"), TINY, corpus, out=folder,
                                                            resume=True, progress=False)))

    # ---- reproduce -------------------------------------------------------------------------------
    for args in (["--steps", "0"], ["--seeds", "0"], ["--seeds", "-1"], ["--preset", "nope"]):
        record("reproduce " + " ".join(args), cli("reproduce", "--out", root / "never", *args))

    # ---- analyze ---------------------------------------------------------------------------------
    def gpt2(name, n_layer=2, n_head=2, on_disk=2, tensors=None, **extra):
        folder = root / name
        folder.mkdir()
        generator = torch.Generator().manual_seed(0)
        weights = tensors if tensors is not None else {
            k: v for i in range(on_disk)
            for k, v in ((f"h.{i}.attn.c_attn.weight", torch.randn(16, 48, generator=generator)),
                         (f"h.{i}.attn.c_proj.weight", torch.randn(16, 16, generator=generator)))}
        save_file(weights, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": n_layer, "n_head": n_head,
                                                        **extra}))
        return folder

    out = root / "analysis"
    record("analyze <missing source>", cli("analyze", root / "nothing", "--out", out))
    record("analyze <folder without config>", cli("analyze", root / "no-texts", "--out", out))
    broken = gpt2("bad-safetensors")
    (broken / "model.safetensors").write_bytes(b"garbage")
    record("analyze <not safetensors>", cli("analyze", broken, "--out", out))
    sharded = gpt2("sharded")
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "gone.safetensors"}}))
    record("analyze <missing shard>", cli("analyze", sharded, "--out", out))
    missing_tensor = gpt2("missing-tensor", 1, tensors={"h.0.attn.c_attn.weight": torch.ones(16, 48)})
    record("analyze <missing tensor>", cli("analyze", missing_tensor, "--out", out))
    one_d = gpt2("one-d", 1, tensors={"h.0.attn.c_attn.weight": torch.ones(48),
                                      "h.0.attn.c_proj.weight": torch.ones(16, 16)})
    record("analyze <1-D weight>", cli("analyze", one_d, "--out", out))
    nan = {"h.0.attn.c_attn.weight": torch.full((16, 48), float("nan")), "h.0.attn.c_proj.weight": torch.ones(16, 16)}
    record("analyze <NaN weights>", cli("analyze", gpt2("nan", 1, tensors=nan), "--out", out))
    record("analyze <n_head 3 for 16-wide heads>", cli("analyze", gpt2("heads3", n_head=3), "--out", out))
    record("analyze <n_layer 0>", cli("analyze", gpt2("layers0", n_layer=0), "--out", out))
    record("analyze <n_layer -1>", cli("analyze", gpt2("layers-1", n_layer=-1), "--out", out))
    record("analyze <n_layer 5 for 2 layers>", cli("analyze", gpt2("layers5", n_layer=5), "--out", out))
    record("analyze <head_dim contradicting tensors>", cli("analyze", gpt2("headdim", head_dim=4), "--out", out))
    record("analyze <unsupported model_type>", cli("analyze", gpt2("t5", model_type="t5"), "--out", out))
    bad_json = gpt2("bad-json")
    (bad_json / "config.json").write_text("{")
    record("analyze <config.json not JSON>", cli("analyze", bad_json, "--out", out))
    torch.manual_seed(0)
    model = GPT(preset("tiny", "mha"))
    wrong_heads = root / "wrong-heads"
    wrong_heads.mkdir()
    (wrong_heads / "config.json").write_text(json.dumps({"format": "headlab",
                                                         "model": {**model.config.to_dict(), "n_head": 2,
                                                                   "n_kv_head": 1}}))
    save_file(dict(model.state_dict()), str(wrong_heads / "model.safetensors"))
    record("analyze <headlab run, wrong n_head>", cli("analyze", wrong_heads, "--out", out))
    record("analyze --label count mismatch", cli("analyze", finished, "--label", "a", "--label", "b", "--out", out))
    record("analyze --circuit xy", cli("analyze", finished, "--circuit", "xy", "--out", out))
    record("analyze --out <under a file>", cli("analyze", finished, "--out", root / "a-file" / "x"))
    no_checkpoint = root / "no-checkpoint"
    no_checkpoint.mkdir()
    shutil.copy(finished / "config.json", no_checkpoint)
    record("analyze <run folder with no checkpoint>", cli("analyze", no_checkpoint, "--out", out))
    saved = analyze(model).save(root / "saved-analysis")
    (saved / "spectra.csv").write_text((saved / "spectra.csv").read_text()[:500])
    record("Analysis.load <truncated CSV>", api(lambda: Analysis.load(saved)))

    # ---- API values ------------------------------------------------------------------------------
    for name, make in (("ModelConfig(rope_base=nan)", lambda: ModelConfig(rope_base=float("nan"))),
                       ("ModelConfig(rope_base=inf)", lambda: ModelConfig(rope_base=float("inf"))),
                       ("ModelConfig(n_layer=1.5)", lambda: ModelConfig(n_layer=1.5)),
                       ("ModelConfig.replace(bogus=1)", lambda: ModelConfig().replace(bogus=1)),
                       ("TrainConfig(grad_clip=nan)", lambda: TrainConfig(grad_clip=float("nan"))),
                       ("TrainConfig(grad_clip=0)", lambda: TrainConfig(grad_clip=0.0)),
                       ("TrainConfig(weight_decay=inf)", lambda: TrainConfig(weight_decay=float("inf"))),
                       ("TrainConfig(lr=nan)", lambda: TrainConfig(lr=float("nan"))),
                       ("TrainConfig(min_lr_ratio=nan)", lambda: TrainConfig(min_lr_ratio=float("nan"))),
                       ("TrainConfig(seed=-1)", lambda: TrainConfig(seed=-1)),
                       ("TrainConfig(steps=True)", lambda: TrainConfig(steps=True)),
                       ("TrainConfig.replace(bogus=1)", lambda: TrainConfig().replace(bogus=1)),
                       ("load_run(<missing>)", lambda: load_run(root / "nothing")),
                       ("train(vocab 128 < byte tokenizer 256)",
                        lambda: train(preset("tiny", vocab_size=128), TINY, corpus, progress=False))):
        record(name, api(make))

    # ---- text corpora: silent-wrong checks ---------------------------------------------------------
    texts = root / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("old words " * 200)
    (texts / "b.txt").write_text("more text " * 200)
    load_corpus(str(texts))
    (texts / "a.txt").write_text("new words " * 200)
    fresh = bytes(load_corpus(str(texts)).train[0][:9])
    record("load_corpus <file rewritten in place>",
           ("recovered", "re-tokenized") if fresh == b"new words" else ("silent", "stale cache"))


    # ---- issue 22: ownership -----------------------------------------------------------------------
    def foreign(name: str) -> Path:  # a Hugging Face Trainer's output folder
        folder = root / name
        (folder / "checkpoint-500").mkdir(parents=True)
        (folder / "checkpoint-500" / "model.safetensors").write_bytes(b"their weights")
        (folder / "config.json").write_text('{"model_type": "gpt2"}')
        (folder / ".config.json.0123abcd.tmp").write_text("named like a headlab temporary")
        (folder / "notes.tmp").write_text("theirs")
        return folder

    short = ["--preset", "tiny", "--corpus", "synthetic", "--steps", "2", "--no-progress"]
    for flags in ([], ["--resume"]):
        out_ = foreign(f"hf-train{len(flags)}")
        record(f"train {' '.join(flags)} --out <HF trainer folder>",
               untouched(lambda: cli("train", *short, *flags, "--out", out_), out_))
    out_ = foreign("hf-analyze")
    record("analyze --out <HF trainer folder>", untouched(lambda: cli("analyze", finished, "--out", out_), out_))
    out_ = foreign("hf-reproduce")
    record("reproduce --out <HF trainer folder>", untouched(lambda: cli("reproduce", "--preset", "tiny", "--steps", "2",
                                                                         "--seeds", "1", "--out", out_), out_))
    for flags in ([], ["--resume"]):
        folder = copy_of_finished(f"no-manifest{len(flags)}")
        (folder / MANIFEST).unlink()
        record(f"train {' '.join(flags)} <run without manifest.json>",
               untouched(lambda: cli(*[f for f in tiny_run if f != "--resume"], *flags, "--out", folder), folder))
    outside = root / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("not headlab's")
    for name, edit in (("checkpoint folder missing",
                        lambda m: m.meta.update(checkpoint={"step": 8, "folder": "checkpoint-99999999"})),
                       ("checkpoint folder ../outside",
                        lambda m: m.meta.update(checkpoint={"step": 8, "folder": "../outside"})),
                       ("checkpoint folder absolute",
                        lambda m: m.meta.update(checkpoint={"step": 8, "folder": str(outside)})),
                       ("discard ../outside/victim.txt", lambda m: m.discard.append("../outside/victim.txt")),
                       ("file ../outside/victim.txt",
                        lambda m: m.files.update({"../outside/victim.txt": {"bytes": 1, "sha256": "0"}})),
                       ("checkpoint step a list", lambda m: m.meta.update(checkpoint={"step": [8], "folder": "x"})),
                       ("files a list", lambda m: setattr(m, "files", []))):
        folder = copy_of_finished("manifest-" + name.replace(" ", "-").replace("/", "_").replace(".", ""))
        manifest = run_manifest(folder)
        edit(manifest)
        manifest.save()
        kept = current_checkpoint(finished).folder.name
        record(f"train --resume, manifest {name}",
               untouched(lambda: api(lambda: train(preset("tiny", "gqa"), TINY, corpus, out=folder, resume=True,
                                                   progress=False)), outside, folder / kept))

    # ---- issue 22: content, not size ---------------------------------------------------------------
    def flip(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 1
        path.write_bytes(bytes(data))

    other_seed = train(preset("tiny", "gqa"), TINY.replace(seed=1), corpus, out=root / "seed1", progress=False).path
    for name, damage, check in (
            ("bit flip in model.safetensors", lambda f: flip(checkpoint_file(f, "model.safetensors")), load_run),
            ("bit flip in state.pt", lambda f: flip(checkpoint_file(f, "state.pt")),
             lambda f: train(preset("tiny", "gqa"), TINY, corpus, out=f, resume=True, progress=False)),
            ("weights of another seed", lambda f: shutil.copy(checkpoint_file(other_seed, "model.safetensors"),
                                                              checkpoint_file(f, "model.safetensors")), load_run),
            ("metrics.jsonl of another seed", lambda f: shutil.copy(other_seed / "metrics.jsonl", f / "metrics.jsonl"),
             load_run),
            ("metrics.jsonl emptied", lambda f: (f / "metrics.jsonl").write_text(""),
             lambda f: train(preset("tiny", "gqa"), TINY, corpus, out=f, resume=True, progress=False)),
            ("config.json lr edited", lambda f: (f / "config.json").write_text((f / "config.json").read_text().replace(
                '"lr": 0.003', '"lr": 0.006')), load_run),
            ("config.json of another seed", lambda f: shutil.copy(other_seed / "config.json", f / "config.json"),
             load_run),
            ("manifest.json truncated", lambda f: (f / MANIFEST).write_bytes((f / MANIFEST).read_bytes()[:50]),
             load_run),
            ("model.safetensors a link to an identical copy", lambda f: (
                shutil.copy(checkpoint_file(f, "model.safetensors"), root / f"copy-{f.name}"),
                checkpoint_file(f, "model.safetensors").unlink(),
                checkpoint_file(f, "model.safetensors").symlink_to(root / f"copy-{f.name}")), load_run)):
        folder = copy_of_finished("content-" + name.replace(" ", "-").replace(".", ""))
        damage(folder)
        record(f"load/resume, {name}", api(lambda: check(folder)))
    saved = analyze(model).save(root / "edited-analysis")
    table = (saved / "summary.csv").read_text()
    digit = next(i for i, c in enumerate(table) if c.isdigit() and i > table.index("\n"))
    (saved / "summary.csv").write_text(table[:digit] + str((int(table[digit]) + 1) % 10) + table[digit + 1:])
    record("Analysis.load <one digit of a table edited>", api(lambda: Analysis.load(saved)))
    os.environ["HEADLAB_CACHE"], cache = str(root / "cache-22"), os.environ.get("HEADLAB_CACHE")
    flip(load_corpus("synthetic").folder / "train_000.bin")
    record("train on a token cache with a bit flip", cli("train", *short))
    os.environ["HEADLAB_CACHE"] = str(root / "cache-22-bpe")
    tokenizer = load_corpus("synthetic", tokenizer="bpe:300").folder / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text() + " ")
    record("load_corpus <BPE tokenizer.json edited>", api(lambda: load_corpus("synthetic", tokenizer="bpe:300")))
    os.environ["HEADLAB_CACHE"] = cache

    # ---- issue 22: confinement -----------------------------------------------------------------------
    for command in ("train", "analyze"):
        target = root / f"lock-target-{command}.txt"
        target.write_text("precious")
        out_ = root / f"linked-lock-{command}"
        out_.mkdir()
        (out_ / ".lock").symlink_to(target)
        argv = ["train", *short, "--out", out_] if command == "train" else ["analyze", finished, "--out", out_]
        record(f"{command} --out <.lock a symlink>", untouched(lambda: cli(*argv), target))
    target = root / "metrics-target.jsonl"
    shutil.copy(finished / "metrics.jsonl", target)
    folder = copy_of_finished("linked-metrics")
    (folder / "metrics.jsonl").unlink()
    (folder / "metrics.jsonl").symlink_to(target)
    record("train --resume <metrics.jsonl a symlink>", untouched(lambda: api(lambda: train(
        preset("tiny", "gqa"), TINY.replace(steps=10), corpus, out=folder, resume=True, progress=False)), target))
    for name, entry in (("../outside/x.safetensors", "../outside/x.safetensors"), ("absolute path", "/etc/hostname"),
                        ("a number", 7), ("a list", ["a"])):
        folder = gpt2("index-" + name.replace("/", "_").replace(".", "").replace(" ", "-"))
        save_file({"h.0.attn.c_attn.weight": torch.ones(16, 48)}, str(outside / "x.safetensors"))
        (folder / "model.safetensors").unlink()
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"h.0.attn.c_attn.weight": entry}}))
        record(f"analyze <index entry {name}>", cli("analyze", folder, "--out", root / "never-analysis"))
    for name, make in (("FIFO named x.txt", lambda path: os.mkfifo(path)),
                       ("symlink named x.txt", lambda path: path.symlink_to(outside / "victim.txt")),
                       ("folder named x.txt", lambda path: path.mkdir())):
        texts_ = root / ("corpus-" + name.split()[0])
        texts_.mkdir()
        (texts_ / "a.txt").write_text("plain words " * 400)
        make(texts_ / "x.txt")
        record(f"train --corpus <folder with a {name}>", cli("train", *short[:2], "--corpus", texts_, *short[4:]))

    # ---- issue 22: values that once escaped as tracebacks -----------------------------------------------
    for args in (["--seq-len", "99999999999999999999"], ["--context", "99999999999999999999"],
                 ["--batch-size", "1e3"], ["--n-kv-head", "-0"], ["--seq-len", "0x10"]):
        record("info " + " ".join(args), cli("info", *args))
    for name, text in (("inf layers", '{"n_layer": 1e999}'), ("list width", '{"d_model": [128]}'),
                       ("huge heads", '{"n_head": 99999999999999999999999}'),
                       ("Infinity rope", '{"rope_base": Infinity}'),
                       ("null attention", '{"attention": null}'), ("dict kv rank", '{"kv_rank": {"a": 1}}'),
                       ("nested", '{"model": {"n_layer": 2}}'), ("top-level string", '"mha"')):
        path = root / f"config-22-{name.replace(' ', '-')}.json"
        path.write_text(text)
        record(f"info --config <{name}>", cli("info", "--config", path))
    for name, extra in (("model_type a list", {"model_type": ["gpt2"]}), ("n_head a string", {"n_head": "2"}),
                        ("n_head 2.5", {"n_head": 2.5}), ("n_head huge", {"n_head": 10 ** 30}),
                        ("n_layer null", {"n_layer": None}), ("n_head NaN", {"n_head": float("nan")})):
        folder = gpt2("hf-" + name.replace(" ", "-").replace(".", ""))
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **extra}))
        record(f"analyze <HF config.json, {name}>", cli("analyze", folder, "--out", root / "never-analysis"))
    real_forward = GPT.forward

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt
    GPT.forward = interrupted
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["train", *short, "--out", str(root / "ctrl-c")])
    GPT.forward = real_forward
    record("Ctrl-C during train",
           ("clear", err.getvalue().strip()) if code == 130 and len(err.getvalue().splitlines()) == 1
           else ("traceback", f"exit {code}: {err.getvalue()[-150:]}"))

    # ---- issue 22: concurrent writers ------------------------------------------------------------------
    shared = root / "concurrent-analysis"
    writing, release, real_write = threading.Event(), threading.Event(), HashingFile.write

    def paused_write(self, data):  # the first analysis (its own thread) stops at its first write
        if threading.current_thread() is not threading.main_thread():
            writing.set()
            release.wait(timeout=HANG_S)
        return real_write(self, data)
    HashingFile.write = paused_write
    writer = threading.Thread(target=main, args=(["analyze", str(finished), "--out", str(shared)],))
    writer.start()
    writing.wait(timeout=HANG_S)
    second = cli("analyze", other_seed, "--label", "second", "--out", shared)
    release.set()
    writer.join()
    HashingFile.write = real_write
    record("two analyses into one --out at once", second)
    models = Analysis.load(shared).models
    record("  ... the folder holds one model's tables", ("recovered", str(models)) if len(models) == 1
           else ("silent", f"models {models}"))

    # ---- faults ----------------------------------------------------------------------------------
    rng = random.Random(0)
    every_step = TINY.replace(checkpoint_every=1)
    reference_every = train(preset("tiny", "gqa"), every_step, corpus, out=root / "reference-every", progress=False)
    for trial in range(10):
        folder = root / f"kill-{trial}"
        for attempt in range(100):
            if not faults.kill_while_writing(lambda: train(preset("tiny", "gqa"), every_step, corpus, out=folder,
                                                           resume=True, progress=False),
                                             folder, rng.uniform(0, 0.03 + 0.01 * attempt)):
                break
        record(f"SIGKILL x{attempt} then resume (trial {trial})", same_run(folder, reference_every))

    import headlab.runs.checkpoints
    for nth in range(1, 5):  # a full disk while writing the nth checkpoint's weights
        folder = root / f"enospc-{nth}"
        with faults.failing_call(headlab.runs.checkpoints, "serialize_safetensors", nth):
            outcome = api(lambda: train(preset("tiny", "gqa"), TINY, corpus, out=folder, progress=False))
        if outcome[0] == "clear":
            train(preset("tiny", "gqa"), TINY, corpus, out=folder, resume=True, progress=False)
            outcome = same_run(folder, reference)
        record(f"ENOSPC in checkpoint {nth}, then resume", outcome)

    pid = os.fork()
    if pid == 0:  # a slow trainer, killed while it holds the folder's lock
        try:
            GPT.forward = (lambda original: lambda self, *a, **k: (time.sleep(0.2), original(self, *a, **k))[1])(
                GPT.forward)
            train(preset("tiny", "gqa"), TINY, corpus, out=root / "busy", progress=False)
        finally:
            os._exit(0)
    while not (root / "busy" / "metrics.jsonl").exists():
        time.sleep(0.02)
    record("second trainer on a busy folder", api(lambda: train(preset("tiny", "gqa"), TINY, corpus, out=root / "busy",
                                                                 progress=False)))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    outcome = api(lambda: train(preset("tiny", "gqa"), TINY, corpus, out=root / "busy", resume=True, progress=False))
    record("stale lock of a killed trainer, resumed",
           same_run(root / "busy", reference) if outcome[0] == "silent" else outcome)
    issue28_classes(root, corpus, copy_of_finished, record)
    results += issue39_classes(root)
    return results


def issue28_classes(root: Path, corpus, copy_of_finished, record) -> None:
    """Issue 28's classes, each a generator of members (tests/faults.py inflicts the faults)."""
    from headlab.report.writer import write_report
    from headlab.study.study import Study
    from headlab.study.tables import tabulate_study
    study = Study("tiny", 2, root / "study28", corpus="synthetic", only=("mha", "mla"))
    write_report(tabulate_study(study.train(seeds=1, progress=False, log=lambda m: None), study.load_corpus(), "tiny",
                                study.folder), study.folder)
    user = root / "user28"
    user.mkdir()
    (user / "headline.md").write_text("the user's own headline")
    (user / "photo.png").write_bytes(b"the user's photo")
    for members in (confinement(root, corpus, copy_of_finished), writes_outside_the_writer(root, study.folder, user),
                    failed_rewrite(root, copy_of_finished), identity_and_reuse(root, study.folder),
                    sweep_grid(root), unbounded_inputs(root), error_paths(root)):
        for name, outcome in members:
            record(name, outcome)


NOT_STRICTLY_BELOW = (".", "./", "", "x/..", "a//b", "./config.json", "..", "../outside/victim.txt", "/etc/hostname")


def confinement(root: Path, corpus, copy_of_finished):
    """Every name that is not a regular file strictly below the folder, in every listed field of
    a run's manifest, and the current checkpoint named for deletion: nothing outside, no user's
    file and no current weights are touched."""
    for field in ("discard", "files"):
        for name in (*NOT_STRICTLY_BELOW, "checkpoint-00000008/.", "checkpoint-00000008"):
            folder = copy_of_finished(f"strict-{field}-{abs(hash(name)) % 10 ** 6}")
            kept = current_checkpoint(folder).folder
            faults.list_in_manifest(folder, field, name)
            (folder / "notes.md").write_text("the user's notes beside the run's files")
            yield (f"train --resume, manifest {field} {name!r}",
                   untouched(lambda: api(lambda: train(preset("tiny", "gqa"), TINY, corpus, out=folder, resume=True,
                                                       progress=False)), root / "outside", folder / "notes.md", kept))


def writes_outside_the_writer(root: Path, study: Path, user: Path):
    """Every file kind `report` and `docs` write (figure, report, docs) where a link to a user's
    file or folder, or a user's own file, stands: written around, never through or over."""
    yield "docs --out <a user's folder with headline.md>", untouched(lambda: cli("docs", study, "--out", user), user)
    for what in ("figures", "figures/spectra_uncentered.png", "report.md", "headline.md"):
        target, saved = study / what, root / f"saved28-{what.replace('/', '_')}"
        if os.path.lexists(target):
            shutil.move(target, saved)
        faults.link(target, user if what == "figures" else user / "photo.png")
        outcome = untouched(lambda: cli("report", study), user)
        if outcome[0] == "silent" and not target.is_symlink():
            outcome = ("clear", "the link was replaced, not written through")
        yield f"report with {what} a link to a user's file", outcome
        faults.remove(target) if target.is_symlink() else None
        if saved.exists() and not target.exists():
            shutil.move(saved, target)


def failed_rewrite(root: Path, copy_of_finished):
    """A rewrite that fails at its nth table (a full disk) keeps the earlier version loadable."""
    import pandas as pd
    analysis = root / "analysis28"
    cli("analyze", copy_of_finished("analysis28-source"), "--out", analysis)
    good = Analysis.load(analysis).summary
    for nth in (1, 3, 5):
        with faults.failing_call(pd.DataFrame, "to_csv", nth):
            outcome = cli("analyze", root / "analysis28-source", "--out", analysis, "--circuit", "both")
        try:
            kept = Analysis.load(analysis).summary.equals(good)
        except ValueError as error:
            kept, outcome = False, ("lost", str(error)[:200])
        yield f"analyze rewrite, full disk at table {nth}", outcome if kept else ("lost", outcome[1])


def identity_and_reuse(root: Path, study: Path):
    """Sources that share a base name are distinct models (or refused); a study.json stating what
    its tables are not (another preset or shape, other seeds) is never reported."""
    for a, b in (("e3a/run", "e3b/run"), ("x/y/run", "z/y/run")):
        for part in (a, b):
            shutil.copytree(root / "analysis28-source", root / "same28" / part)
        out_ = root / f"same28-{a.replace('/', '_')}"
        outcome = cli("analyze", root / "same28" / a, root / "same28" / b, "--out", out_)
        if outcome[0] == "silent":
            outcome = ("clear", "two models") if Analysis.load(out_).summary["model"].nunique() == 2 else (
                "silent", "one model")
        yield f"analyze {a} {b}", outcome
    for edit in ({"preset": "paper-6.3b"}, {"preset": "cpu-small", "n_layer": 4, "n_head": 6, "d_model": 128},
                 {"seeds": [0, 1, 2], "n_runs": 6}, {"preset": None}):
        edited = root / f"meta28-{abs(hash(str(edit))) % 10 ** 6}"
        shutil.copytree(study, edited, symlinks=True)
        faults.edit_study_meta(edited, **edit)
        outcome = cli("report", edited)
        if outcome[0] == "silent" and str(edit.get("preset")) in (edited / "report.md").read_text():
            outcome = ("silent", f"the report states {edit}")
        yield f"report after study.json edited to {edit}", outcome


def sweep_grid(root: Path):
    """Grids that are not what they say: lengths that round to one step count, duplicates,
    values that map to one folder, a depth overridden by --set, lengths too long to train."""
    base = ["sweep", "--preset", "tiny", "--seeds", "1", "--only", "mha", "mla", "--out", root / "sweep28"]
    for flags in (["--lengths", "0.001", "0.01"], ["--lengths", "1", "1"], ["--lengths", "0.5", "0.50001"],
                  ["--depths", "2", "--set", "n_layer=1,2"], ["--set", "rope_base=100000,100000.4"],
                  ["--lengths", "1e9"], ["--set", "lr=0.003,0.003"]):
        yield f"sweep {' '.join(flags)}", cli(*base, *flags, "--jobs", "1")


def unbounded_inputs(root: Path):
    """Counts so large that planning or training them would run for ever: refused at once."""
    for flag, value in (("--tokens", 2 ** 62), ("--steps", 2 ** 40), ("--jobs", 9664), ("--tokens", 10 ** 30)):
        for plan in (["--plan"], []):
            yield (f"reproduce {flag} {value} {' '.join(plan)}",
                   cli("reproduce", "--preset", "tiny", "--out", root / "unbounded28", flag, value, *plan))


def error_paths(root: Path):
    """Every way a document corpus can be damaged or odd: one line, status 2."""
    import gzip
    documents = "".join(json.dumps({"text": f"document {i} " + "word " * 60}) + "\n" for i in range(30)).encode()
    corpora = {"truncated.jsonl.gz": gzip.compress(documents)[:-40], "gzip.jsonl.zst": gzip.compress(documents),
               "latin1.jsonl": documents.replace(b"document 7 ", b"document 7 \xe9", 1),
               "number.jsonl": documents + b'{"text": 5}\n', "null.jsonl": b'{"text": null}\n' + documents,
               "list.jsonl": b'{"text": ["a"]}\n' + documents, "three.jsonl": documents[:300],
               "not-json.jsonl": documents + b"{oops\n", "empty.jsonl.gz": gzip.compress(b"")}
    for name, data in corpora.items():
        (root / name).write_bytes(data)
        yield f"train --corpus {name}", cli("train", "--preset", "tiny", "--corpus", root / name, "--steps", "1",
                                            "--no-progress")


def issue39_classes(root: Path) -> list[tuple[str, str, str]]:
    """Issue 39's classes 2 (diverged training reported as a result) and 4 (grids and inputs):
    members of none of the lists above, each judged by what it must do, not only by its exit."""
    results = []
    for cls, members in (("diverged", diverged_runs(root)), ("grids and inputs", grids_and_inputs(root))):
        for name, outcome in members:
            results.append((f"[{cls}] {name}", *outcome))
            print(f"{outcome[0]:<10} [{cls}] {name:<60} {outcome[1][:110]}", flush=True)
    return results


STUDY39 = ["--preset", "tiny", "--corpus", "synthetic", "--steps", "4", "--seeds", "1", "--only", "mha", "mla"]
SWEEP39 = ["sweep", "--preset", "tiny", "--lengths", "0.1", "--seeds", "1", "--only", "mha", "mla"]


def marked_diverged(run: Path) -> bool:
    """Whether a run folder's manifest records that it diverged (read as JSON: any version)."""
    return isinstance(json.loads((run / MANIFEST).read_text()).get("meta", {}).get("diverged"), dict)


def judged(outcome: tuple[str, str], holds: bool, what: str) -> tuple[str, str]:
    """A command's outcome, 'silent' when it ran or was refused but `holds` is false (`what` says why)."""
    return outcome if holds or outcome[0] != "clear" and outcome[0] != "silent" else ("silent", what)


def diverged_runs(root: Path):
    """Runs that end worse than a uniform guess, or at a non-finite loss, through every way in:
    each must be marked, refused as a result in one line, and never trained again."""
    run = root / "div-train"
    outcome = cli("train", "--preset", "tiny", "--corpus", "synthetic", "--steps", "4", "--lr", "10", "--no-progress",
                  "--out", run)
    yield "train --lr 10: the run folder says diverged", (("clear", "marked") if outcome[0] == "silent" and
                                                          marked_diverged(run) else ("silent", "not marked"))
    outcome = cli("train", "--preset", "tiny", "--corpus", "synthetic", "--steps", "4", "--lr", "10", "--no-progress",
                  "--resume", "--out", run)
    yield "train --resume of a finished diverged run keeps the mark", (
        ("clear", "still marked") if outcome[0] == "silent" and marked_diverged(run) else ("silent", "mark lost"))
    study = root / "div-study"
    for rerun in ("", " (rerun)"):
        before = {p: p.read_bytes() for p in study.rglob("metrics.jsonl")}
        outcome = cli("reproduce", *STUDY39, "--jobs", "1", "--set", "lr=10", "--out", study)
        retrained = any(p.read_bytes() != data for p, data in before.items())
        yield f"reproduce --set lr=10{rerun}", judged(outcome, outcome[0] == "clear" and "diverged" in outcome[1]
                                                      and not retrained, f"reported as a result: {outcome[1][:80]}")
    outcome = cli("reproduce", *STUDY39, "--jobs", "2", "--set", "lr=10", "--out", root / "div-jobs")
    yield "reproduce --set lr=10 --jobs 2", judged(outcome, "diverged" in outcome[1], "not named as diverged")
    for lr in ("1e18", "1e6"):  # finite settings whose losses become NaN
        outcome = cli("reproduce", *STUDY39, "--jobs", "1", "--set", f"lr={lr}", "--out", root / f"div-{lr}")
        yield f"reproduce --set lr={lr} (non-finite loss)", judged(outcome, "diverged" in outcome[1] or
                                                                   "loss is" in outcome[1], "not named")
        before = {p: p.read_bytes() for p in (root / f"div-{lr}").rglob("metrics.jsonl")}
        outcome = cli("reproduce", *STUDY39, "--jobs", "1", "--set", f"lr={lr}", "--out", root / f"div-{lr}")
        retrained = any(p.read_bytes() != data for p, data in before.items())
        yield f"reproduce --set lr={lr} (rerun: not trained again)", judged(
            outcome, not retrained and "diverged" in outcome[1], "trained again, or not named")
    sweep = root / "div-sweep"
    for rerun in ("", " (rerun)"):
        outcome = cli(*SWEEP39, "--jobs", "1", "--set", "lr=0.003,10", "--out", sweep)
        written = (sweep / "sweep.csv").exists() and "lr10" not in (sweep / "sweep.csv").read_text()
        yield f"sweep --set lr=0.003,10{rerun}: the good point tabulated", (
            ("clear", "the other point written") if outcome[0] == "silent" and written else
            (outcome[0] if outcome[0] != "clear" else "silent", f"sweep.csv not written: {outcome[1][:80]}"))
    outcome = cli(*SWEEP39, "--jobs", "1", "--set", "lr=10,20", "--out", root / "div-sweep-all")
    yield "sweep --set lr=10,20 (every point diverged)", judged(outcome, "diverged" in outcome[1], "not named")
    outcome = cli(*SWEEP39, "--jobs", "2", "--set", "lr=10", "--out", root / "div-sweep-jobs")
    yield "sweep --set lr=10 --jobs 2 (worker processes)", judged(outcome, "diverged" in outcome[1], "not named")
    tampered = root / "div-tampered"
    shutil.copytree(study, tampered)
    for manifest in (tampered / "runs").glob("*/manifest.json"):
        faults.edit_json(manifest, lambda data: data["meta"].update(diverged={"step": "x"}))
    outcome = cli("reproduce", *STUDY39, "--jobs", "1", "--set", "lr=10", "--out", tampered)
    yield "reproduce over runs whose divergence record is garbage", outcome


def grids_and_inputs(root: Path):
    """Grids that count one setting twice, study settings that cannot hold, refusals that leave a
    folder or say "reused" first, files that are not regular, a closed output, a damaged install."""
    import subprocess
    for flags in (["--set", "lr=0.001", "--set", "lr=0.002"], ["--set", "kv_residual_init=0,-0"],
                  ["--set", "weight_decay=0,-0.0"], ["--set", "rope_base=1e4,10000.0"],
                  ["--set", "lr=0.01", "--set", "weight_decay=0", "--set", "lr=0.02,0.03"],
                  ["--set", "attention=mla,mha"], ["--set", "device=meta"], ["--jobs", "99"],
                  ["--set", "kv_rank=2,4"], ["--set", "vocab_size=300,400"]):
        out = root / f"grid39-{abs(hash(str(flags))) % 10 ** 6}"
        outcome = cli(*SWEEP39, *flags, "--out", out)
        yield f"sweep {' '.join(flags)}", judged(outcome, not out.exists(), "refused, or accepted, leaving a folder")
    for setting in ("vocab_size=512", "kv_rank=8", "grad_accum=3", "n_kv_head=3", "device=meta", "attention=gqa"):
        out = root / f"study39-{setting.replace('=', '-')}"
        roles = ["--only", "mha", "lrkv-small", "lrkv-large"] if setting == "kv_rank=8" else []  # r = 8 for both
        outcome = cli("reproduce", *STUDY39, *roles, "--jobs", "1", "--set", setting, "--out", out)
        yield f"reproduce {' '.join(roles)} --set {setting}", judged(
            outcome, not out.exists() and "copy out of meta tensor" not in outcome[1],
            f"left a folder or a torch message: {outcome[1][:80]}")
    reused = root / "study39-reused"
    cli("reproduce", *STUDY39, "--jobs", "1", "--out", reused)
    said, err = io.StringIO(), io.StringIO()  # cli() keeps stdout to itself: what is said is read here
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(err):
        code = main(["reproduce", *STUDY39, "--jobs", "1", "--set", "lr=0.01", "--out", str(reused)])
    yield "reproduce of changed settings says nothing reused first", (
        ("clear", err.getvalue().strip()[-120:]) if code == 2 and "reused" not in said.getvalue() else
        ("silent", f"status {code}, said: {said.getvalue().strip()[-100:]}"))
    source = root / "finished"
    for what in ("config.json", "model.safetensors"):
        model = root / f"fifo39-{what}"
        shutil.copytree(source, model) if what != "config.json" else model.mkdir()
        if what == "config.json":
            os.mkfifo(model / what)
        else:  # a Hugging Face layout whose weights are a FIFO
            (model / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_head": 2,
                                                           "n_embd": 8, "vocab_size": 16, "n_positions": 8}))
            (model / "manifest.json").unlink()
            faults.remove(model / what) if (model / what).exists() else None
            os.mkfifo(model / what)
        yield f"analyze a folder whose {what} is a FIFO", cli("analyze", model, "--out", root / f"fifo39-{what}-out")
    linked = root / "fifo39-link"
    linked.mkdir()
    os.symlink(root / "fifo39-config.json" / "config.json", linked / "config.json")
    yield "analyze a folder whose config.json links to a FIFO", cli("analyze", linked, "--out", root / "fifo39-l-out")
    folder_config = root / "fifo39-folder"
    (folder_config / "config.json").mkdir(parents=True)
    yield "analyze a folder whose config.json is a folder", cli("analyze", folder_config, "--out", root / "f39-out")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    for argv in (["info"], ["analyze", str(source), "--out", str(root / "pipe39")]):
        command = subprocess.Popen([sys.executable, "-m", "headlab", *argv], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=env)
        command.stdout.close()
        err, status = command.stderr.read().decode(), command.wait()
        yield f"{' '.join(argv[:1])} | a reader that has gone", (
            ("clear", f"stopped quietly, status {status}") if not err else ("silent", err.strip()[-120:]))
    from headlab.study import tables as tables_module
    from headlab.study.study import Study
    from headlab.study.table_files import DEMO_PRESET, SHIPPED
    for damage in ("edited", "deleted"):
        package = root / f"demo39-{damage}" / DEMO_PRESET
        shutil.copytree(SHIPPED, package)
        summary = package / "summary.csv"
        summary.write_text(summary.read_text() + "0") if damage == "edited" else summary.unlink()
        shipped, tables_module.SHIPPED_ROOT = tables_module.SHIPPED_ROOT, package.parent
        try:
            outcome = api(lambda: tables_module.study_tables(Study(DEMO_PRESET, None, root / "demo39-study"), 3,
                                                             log=lambda line: None, train=False))
        finally:
            tables_module.SHIPPED_ROOT = shipped
        yield f"demo tables {damage} in the install", judged(outcome, "damaged" in outcome[1],
                                                             f"the install not named: {outcome[1][:80]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="scratch folder (default: a temporary one, deleted after)")
    parser.add_argument("--issue39", action="store_true", help="only issue 39's classes 2 and 4 (minutes, not hours)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["HEADLAB_CACHE"] = str(Path(scratch) / "cache")
        root = args.out or Path(scratch) / "cases"
        root.mkdir(parents=True, exist_ok=True)
        if args.issue39:
            train(preset("tiny", "gqa"), TINY, load_corpus("synthetic"), out=root / "finished", progress=False)
            results = issue39_classes(root)
        else:
            results = main_cases(root)
    counts = Counter(outcome for _, outcome, _ in results)
    print(f"\n{len(results)} cases: " + ", ".join(f"{counts[k]} {k}" for k in
                                                  ("clear", "recovered", "traceback", "silent", "lost", "hang")))
    print(f"data lost {counts['lost']}, silent wrong {counts['silent']}, tracebacks {counts['traceback']}, "
          f"hangs {counts['hang']}")
    sys.exit(1 if counts["traceback"] + counts["silent"] + counts["lost"] + counts["hang"] else 0)
