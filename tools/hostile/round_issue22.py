"""The first rounds of hostile inputs (issue 22 and before): the CLI's and the API's bad values,
damaged run folders, ownership, content, confinement, concurrent writers and faults (kill -9, a
full disk, a stale lock), each outcome classified (`hostile.harness`)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import signal
import threading
import time
from pathlib import Path

import torch
from hostile.harness import (
    HANG_S,
    TINY,
    TINY_FLAGS,
    api,
    cli,
    copy_of,
    faults,
    finished_run,
    recorder,
    same_run,
    untouched,
)
from safetensors.torch import save_file

from headlab import ModelConfig, TrainConfig, load_corpus, load_run, preset, train
from headlab.analysis.similarity import Analysis, analyze
from headlab.cli.main import main
from headlab.io import HashingFile
from headlab.model.gpt import GPT
from headlab.runs.checkpoints import current_checkpoint
from headlab.runs.layout import MANIFEST, run_manifest

NAME = "issue22"


def run(root: Path) -> list[tuple[str, str, str]]:
    results = []
    record = recorder(results)
    corpus = load_corpus("synthetic")
    reference = train(preset("tiny", "gqa"), TINY, corpus, out=root / "reference", progress=False)
    finished = finished_run(root)

    def copy_of_finished(name: str) -> Path:
        return copy_of(root, finished, name)

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
    return results
