"""Issue 45's io round: fresh hostile inputs (in none of the earlier lists, tools/hostile_round7_io.py's
included) against what headlab reads, replaces and deletes: classes 1 and 5 (a Hub cache read
through its links, never out of it), 2 (write-ahead records and temporaries' names license
nothing), 3 (a manifest owns nothing inside another manifest's folder) and 8 (links, FIFOs,
sockets and hard links where files go; kill -9 at chosen writes and a full disk, each followed by
the same command, which must give the uninterrupted result). Every command on a folder headlab
wrote is judged by the tree-diff checker (`hostile.cases.on_tree`)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from functools import partial
from pathlib import Path

from hostile.cases import Case, either, on_tree, refusal, run_cases, success
from hostile.harness import TINY, cli, faults, recorder

from headlab import load_corpus, preset, train

NAME = "issue45_io"
COMMIT, OLDER = "0123456789abcdef0123456789abcdef01234567", "89abcdef0123456789abcdef0123456789abcdef"
STUDY = ["reproduce", "--preset", "tiny", "--corpus", "synthetic", "--steps", "4", "--seeds", "1", "--only", "mha",
         "mqa", "--jobs", "1"]


# ---- templates, made once per scratch root ------------------------------------------------------

PLACE: dict[str, Path] = {}  # "root": the scratch folder of the round that runs (set by `run`)


def template(folder: Path | None = None) -> Path:
    """<root>/template7: a tiny MHA/MQA study with its report, docs beside it, the analysis of its
    MQA run, and an uninterrupted TINY run (the reference of kills); made once per scratch root."""
    base = PLACE["root"] / "template7"
    if not (base / "done").exists():
        shutil.rmtree(base, ignore_errors=True)
        for argv in (STUDY + ["--out", base / "study"], ["docs", base / "study", "--out", base / "docs"]):
            assert cli(*argv, seconds=1800)[0] == "silent", argv
        assert cli("analyze", mqa_run(base / "study"), "--out", base / "analysis")[0] == "silent"
        train(preset("tiny", "gqa"), TINY, load_corpus("synthetic"), out=base / "run", progress=False)
        (base / "done").write_text("")
    return base


def mqa_run(study: Path) -> Path:
    return study / "runs" / "mqa-seed0"


def tree(folder: Path) -> Path:
    """A copy of the template (study, docs, analysis, run) in `folder`/tree, the user's notes in the study."""
    copy = folder / "tree"
    shutil.copytree(template(folder), copy, symlinks=True)
    (copy / "study" / "notes.md").write_text("the user's own notes")
    return copy


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def forge(manifest: Path, field: str, name: str, state: str) -> None:
    """Record `name` in `field` of `manifest` by hand, as a forger would: `state` 'none' (no content,
    an `intended` entry only), 'right' (the size and hash of what is there now) or 'wrong'."""
    path = manifest.parent / name
    data = path.read_bytes() if state == "right" else b"something else entirely"
    entry = None if state == "none" else {"bytes": len(data), "sha256": digest(data)}

    def change(payload):
        if field == "discard":
            payload["discard"].append(name)
            payload.setdefault("folders", []).append(name)
        else:
            payload.setdefault(field, {})[name] = entry
    assert faults.edit_json(manifest, change)


# ---- 1 and 5: the Hub cache -----------------------------------------------------------------------

def gpt2(folder: Path, n_layer: int) -> Path:
    """A tiny GPT-2 saved in several shards with their index (transformers' save_pretrained)."""
    if not (folder / "config.json").exists():
        import torch
        import transformers
        torch.manual_seed(n_layer)
        model = transformers.GPT2Model(transformers.GPT2Config(n_layer=n_layer, n_head=4, n_embd=32, vocab_size=64,
                                                               n_positions=32))
        model.save_pretrained(str(folder), max_shard_size="40KB")
    return folder


def hub(folder: Path, name: str = "m", commit: str = COMMIT, n_layer: int = 2, absolute: bool = False) -> Path:
    """`folder`/hub/models--org--`name` laid out as the Hub lays a download out (refs/main, a
    snapshot of links into blobs/), the cache made the Hub client's; returns the repository folder."""
    import huggingface_hub
    checkpoint = gpt2(PLACE["root"] / f"gpt2-{n_layer}", n_layer)
    cache = folder / "hub"
    repo = cache / f"models--org--{name}"
    snapshot = repo / "snapshots" / commit
    for path in (repo / "blobs", snapshot, repo / "refs"):
        path.mkdir(parents=True, exist_ok=True)
    for source in sorted(checkpoint.iterdir()):
        blob = repo / "blobs" / digest(source.read_bytes())
        shutil.copyfile(source, blob)
        (snapshot / source.name).symlink_to(blob if absolute else Path("../../blobs") / blob.name)
    (repo / "refs" / "main").write_text(commit)
    huggingface_hub.constants.HF_HUB_CACHE, huggingface_hub.constants.HF_HUB_OFFLINE = str(cache), True
    os.environ.update(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    return repo


def analyze_hub(folder: Path, name: str = "m") -> tuple[str, str]:
    return cli("analyze", f"hf:org/{name}", "--no-figure", "--out", folder / "out")


def layers_read(folder: Path) -> set:
    import pandas as pd
    return set(pd.read_csv(folder / "out" / "summary.csv")["layer"])


def hub_no_exist(folder):
    repo = hub(folder)
    (repo / ".no_exist" / COMMIT).mkdir(parents=True)
    (repo / ".no_exist" / COMMIT / "model.safetensors").write_text("")
    return success(analyze_hub(folder), lambda: layers_read(folder) == {0, 1}, "both layers read")


def hub_ref_newline(folder):
    repo = hub(folder)
    (repo / "refs" / "main").write_text(COMMIT + "\n")
    return either(analyze_hub(folder), lambda: layers_read(folder) == {0, 1}, "both layers read")


def hub_two_snapshots(folder):
    hub(folder, commit=OLDER, n_layer=1)
    hub(folder, commit=COMMIT, n_layer=2)  # refs/main now names the 2-layer snapshot
    return success(analyze_hub(folder), lambda: layers_read(folder) == {0, 1}, "the snapshot refs/main names read")


def hub_dotted_absolute(folder):
    repo = hub(folder)
    for link in sorted((repo / "snapshots" / COMMIT).iterdir()):
        target = repo / "snapshots" / ".." / "blobs" / Path(os.readlink(link)).name
        link.unlink()
        link.symlink_to(str(target))
    return success(analyze_hub(folder), lambda: layers_read(folder) == {0, 1}, "both layers read")


def outside_copy(folder: Path, n_layer: int = 1) -> Path:
    """A real checkpoint outside the cache: reading it through the cache is the escape."""
    outside = folder / "outside"
    shutil.copytree(gpt2(PLACE["root"] / f"gpt2-{n_layer}", n_layer), outside)
    return outside


def hub_dots_out(folder):
    repo = hub(folder)
    outside_copy(folder, n_layer=2)  # the same shard names as the model's
    for link in sorted((repo / "snapshots" / COMMIT).glob("model-*.safetensors")):
        link.unlink()
        link.symlink_to(Path("../../blobs/../../../outside") / link.name)  # text through blobs/, lands outside
    return refusal(analyze_hub(folder), "outside", escape=True)


def hub_repo_linked_out(folder):
    repo = hub(folder)
    moved = folder / "elsewhere" / repo.name
    moved.parent.mkdir()
    shutil.move(repo, moved)
    repo.symlink_to(moved, target_is_directory=True)
    return refusal(analyze_hub(folder), "outside", escape=True)


def hub_snapshots_of_another(folder):
    hub(folder, name="other", n_layer=1)
    repo = hub(folder, name="m")
    shutil.rmtree(repo / "snapshots")
    (repo / "snapshots").symlink_to("../models--org--other/snapshots", target_is_directory=True)
    return refusal(analyze_hub(folder), "outside")


def hub_ref_fifo(folder):
    repo = hub(folder)
    (repo / "refs" / "main").unlink()
    os.mkfifo(repo / "refs" / "main")
    return refusal(analyze_hub(folder), "refs/main")


def hub_ref_unknown(folder):
    repo = hub(folder)
    (repo / "refs" / "main").write_text("f" * 40)
    return refusal(analyze_hub(folder), "hf:org/m")


def hub_index_names_missing(folder):
    repo = hub(folder)
    index = repo / "snapshots" / COMMIT / "model.safetensors.index.json"
    payload = json.loads(index.read_text())
    first = sorted(payload["weight_map"])[0]
    payload["weight_map"][first] = "model-00009-of-00009.safetensors"
    data = json.dumps(payload).encode()
    (repo / "blobs" / digest(data)).write_bytes(data)
    index.unlink()
    index.symlink_to(Path("../../blobs") / digest(data))
    return refusal(analyze_hub(folder), "model-00009-of-00009.safetensors")


def hub_index_blob_empty(folder):
    repo = hub(folder)
    os.truncate((repo / "snapshots" / COMMIT / "model.safetensors.index.json").resolve(), 0)
    return refusal(analyze_hub(folder), "model.safetensors.index.json")


def hub_incomplete_blob(folder):
    repo = hub(folder)
    last = sorted((repo / "snapshots" / COMMIT).glob("model-*.safetensors"))[-1]
    blob = last.resolve()
    last.unlink()
    blob.rename(blob.with_name(blob.name + ".incomplete"))  # what an interrupted download leaves
    return refusal(analyze_hub(folder), last.name)


HUB = [("1", "hf: sharded, beside the Hub's .no_exist marker of model.safetensors", hub_no_exist),
       ("1", "hf: sharded, refs/main ending in a newline", hub_ref_newline),
       ("1", "hf: two snapshots, refs/main naming the 2-layer one", hub_two_snapshots),
       ("1", "hf: sharded, links absolute through snapshots/../blobs", hub_dotted_absolute),
       ("5", "hf: shard links ../../blobs/../../../outside/<shard>", hub_dots_out),
       ("5", "hf: models--org--m itself a link to a folder outside the cache", hub_repo_linked_out),
       ("5", "hf: snapshots/ a link to another model's snapshots in the cache", hub_snapshots_of_another),
       ("5", "hf: refs/main a FIFO", hub_ref_fifo),
       ("5", "hf: refs/main naming a commit with no snapshot", hub_ref_unknown),
       ("1", "hf: index weight_map naming a shard not in the snapshot", hub_index_names_missing),
       ("1", "hf: the index's blob empty", hub_index_blob_empty),
       ("1", "hf: last shard's blob left as <sha>.incomplete, its link gone", hub_incomplete_blob)]


# ---- 2 and 3: records that license nothing, manifests reaching into others' folders ----------------

def report(folder: Path, forged=None, user=None, expect="ok", words=(), command="report"):
    """`headlab report` (or `docs`, `analyze`) on a fresh tree after `user(tree)` put a user's file
    in place (returning the paths to watch) and `forged(tree)` forged records."""
    copy = tree(folder)
    watched = list(user(copy) or []) if user else []
    if forged:
        forged(copy)
    argv = {"report": ["report", copy / "study"], "docs": ["docs", copy / "study", "--out", copy / "docs"],
            "analyze": ["analyze", mqa_run(copy / "study"), "--out", copy / "analysis"]}[command]
    return on_tree(copy, argv, expect, *words, watched=watched + [copy / "study" / "notes.md"])


def users(relative: str, kind: str = "file"):
    """A user's entry at `relative` below the tree: a file, a folder holding one, or a link to a user's file."""
    def put(copy: Path):
        path, mine = copy / relative, copy / "mine.txt"
        mine.write_text("the user's file")
        if kind == "folder":
            path.mkdir()
            (path / "inside.txt").write_text("the user's")
            return [path / "inside.txt", mine]
        if kind == "link":
            path.symlink_to(mine)
            return [path, mine]
        if kind == "hardlink":  # the user's second name for the very file headlab wrote
            mine.unlink()
            os.link(path, mine)
            return [mine]
        path.write_text("the user's file, named like a temporary")
        return [path]
    return put


def forged(manifest: str, field: str, name: str, state: str, before=None):
    def forge_in(copy: Path):
        if before:
            before(copy)
        target = name.replace("<run>", "mqa-seed0")
        forge(copy / manifest, field, target, state)
    return forge_in


def nested_analysis_in_run(folder):
    copy = tree(folder)
    run = copy / "run"
    outcome = cli("analyze", run, "--no-figure", "--out", run / "analysis")
    if outcome[0] != "silent":
        return either(outcome)
    forge(run / "manifest.json", "retired", "analysis/summary.csv", "right")
    from hostile.round_issue45_faults import train_argv
    return on_tree(copy, train_argv(run), "either", watched=[run / "analysis" / "summary.csv"])


def nested_docs_in_study(folder):
    copy = tree(folder)
    study = copy / "study"
    if cli("docs", study, "--out", study / "docs")[0] != "silent":
        return "clear", "docs inside a study refused"
    forge(study / "study.json", "retired", "docs/headline.md", "right")
    return on_tree(copy, ["report", study], "ok", watched=[study / "docs" / "headline.md"])


RECORDS = [
    ("2", "docs beside a user's .headline.md.0123abcd.tmp", partial(
        report, user=users("docs/.headline.md.0123abcd.tmp"), command="docs")),
    ("2", "analyze beside a user's .summary.csv.89abcdef.tmp", partial(
        report, user=users("analysis/.summary.csv.89abcdef.tmp"), command="analyze")),
    ("2", "report beside a user's folder .report.md.0123abcd.tmp/", partial(
        report, user=users("study/.report.md.0123abcd.tmp", "folder"))),
    ("2", "report beside a link .report.md.0123abcd.tmp -> a user's file", partial(
        report, user=users("study/.report.md.0123abcd.tmp", "link"))),
    ("2", "report, intended report.md with the right hash of the report there", partial(
        report, forged=forged("study/study.json", "intended", "report.md", "right"))),
    ("2", "report, intended (no content) naming the user's notes.md", partial(
        report, forged=forged("study/study.json", "intended", "notes.md", "none"))),
    ("2", "report, discard and folders naming the user's notes.md", partial(
        report, forged=forged("study/study.json", "discard", "notes.md", "none"))),
    ("2", "report, discard and folders naming a user's folder mine/", partial(
        report, user=users("study/mine", "folder"), forged=forged("study/study.json", "discard", "mine", "none"))),
    ("2", "report, files entry (wrong hash) naming the user's notes.md", partial(
        report, forged=forged("study/study.json", "files", "notes.md", "wrong"), expect="either")),
    ("2", "report, retired entry (wrong hash) naming the user's notes.md", partial(
        report, forged=forged("study/study.json", "retired", "notes.md", "wrong"))),
    ("2", "analyze, intended summary.csv (wrong hash) + a user's summary.csv", partial(
        report, command="analyze", expect="refused", words=("summary.csv",), user=users("analysis/summary.csv"),
        forged=forged("analysis/analysis.json", "intended", "summary.csv", "wrong"))),
    ("2", "docs, headline.md both listed and retired (right hash)", partial(
        report, command="docs", forged=forged("docs/docs.json", "retired", "headline.md", "right"))),
    ("3", "report, study.json retired (right hash) naming runs/<run>/metrics.jsonl", partial(
        report, forged=forged("study/study.json", "retired", "runs/<run>/metrics.jsonl", "right"))),
    ("3", "report, study.json files (right hash) naming runs/<run>/starts.jsonl", partial(
        report, forged=forged("study/study.json", "files", "runs/<run>/starts.jsonl", "right"), expect="either")),
    ("3", "report, study.json discard and folders naming a whole run folder", partial(
        report, forged=forged("study/study.json", "discard", "runs/<run>", "none"))),
    ("3", "report, study.json intended (no content) naming runs/<run>/config.json", partial(
        report, forged=forged("study/study.json", "intended", "runs/<run>/config.json", "none"))),
    ("3", "report, study.json retired (right hash) naming docs/headline.md of docs inside the study",
     nested_docs_in_study),
    ("3", "train --resume, run manifest retired (right hash) naming its analysis/summary.csv",
     nested_analysis_in_run),
]


CASES = [Case(cls, name, inflict) for cls, name, inflict in HUB + RECORDS]


def run(root: Path) -> list[tuple[str, str, str]]:
    results = []
    PLACE["root"] = root / "issue45"
    run_cases(CASES, PLACE["root"] / NAME, recorder(results, width=72))
    return results
