"""A fresh attack on headlab's disk mechanism (issue 28's closing count): inputs no earlier test
or benchmark wrote, tried as a careful or a tired user would, each outcome classed as

    ok          refused in one line (exit 2), or done right
    lost        headlab changed or deleted what it did not write, or lost a good version
    wrong       exit 0 with a wrong result (a file written where it must not be, stale data)
    traceback   an exception escaped, or the CLI exited 1
    hang        no answer within hostile_inputs.HANG_S seconds

    PYTHONPATH=. python tools/disk_attack.py [--out /tmp/attack]   (as root: it mounts read-only binds)

The faults are tests/faults.py's; the CLI is run in this process (hostile_inputs.cli) or, for
kills, limits and concurrency, in forked children."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unicodedata
from collections import Counter
from pathlib import Path

try:
    import hostile_inputs
except ImportError:  # run from the repository root: tools/ itself is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import hostile_inputs
import torch

import faults
import treediff
from headlab.cli.main import main
from headlab.runs.checkpoints import current_checkpoint
from headlab.training.runs import load_run

TRAIN = ["train", "--preset", "tiny", "--corpus", "synthetic", "--steps", "4", "--batch-size", "4",
         "--eval-every", "2", "--checkpoint-every", "2", "--log-every", "1", "--no-progress"]
TRAIN8 = [*TRAIN[:6], "8", *TRAIN[7:]]
CLASSES = ("ok", "lost", "wrong", "traceback", "hang")


def digest_tree(path: Path) -> dict:
    return hostile_inputs.snapshot(path) if os.path.lexists(path) else {}


def judged(outcome: tuple[str, str], watched: dict[Path, dict], accept_success: bool) -> tuple[str, str]:
    """hostile_inputs' outcome as this attack's class: 'silent' (exit 0) is ok where the input is
    a valid one (`accept_success`), wrong otherwise; any watched path that changed is lost."""
    changed = [str(p) for p, before in watched.items() if digest_tree(p) != before]
    if changed:
        return "lost", f"changed {', '.join(changed)[:150]}"
    kind, detail = outcome
    return {"clear": "ok", "recovered": "ok", "silent": "ok" if accept_success else "wrong"}.get(kind, kind), detail


def run(argv, watch=(), accept_success=False) -> tuple[str, str]:
    watched = {Path(p): digest_tree(Path(p)) for p in watch}
    return judged(hostile_inputs.cli(*argv), watched, accept_success)


def weights(folder: Path) -> dict:
    return load_run(folder).model.state_dict()


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


class ReadOnly:
    """A read-only bind mount of `folder` onto itself (root only): chmod does not stop root."""

    def __init__(self, folder: Path):
        self.folder = folder

    def __enter__(self):
        subprocess.run(["mount", "--bind", str(self.folder), str(self.folder)], check=True)
        subprocess.run(["mount", "-o", "remount,ro,bind", str(self.folder)], check=True)

    def __exit__(self, *exc):
        subprocess.run(["umount", str(self.folder)], check=True)


@contextlib.contextmanager
def token_cache(value):
    """HEADLAB_CACHE set to `value` for the block, then back to what it was (the attack's own cache)."""
    previous = os.environ["HEADLAB_CACHE"]
    os.environ["HEADLAB_CACHE"] = str(value)
    try:
        yield
    finally:
        os.environ["HEADLAB_CACHE"] = previous


def attacks(root: Path):
    """(name, thunk) for every attack; each thunk returns (class, detail)."""
    run_ = root / "run"
    assert main([*TRAIN, "--out", str(run_)]) == 0
    study = root / "study"
    assert main(["reproduce", "--preset", "tiny", "--corpus", "synthetic", "--steps", "4", "--seeds", "1", "--only",
                 "mha", "mla", "--jobs", "1", "--out", str(study)]) == 0
    reference8 = root / "reference8"
    assert main([*TRAIN8, "--out", str(reference8)]) == 0
    user = root / "user"
    user.mkdir()
    (user / "notes.md").write_text("the user's notes")

    def copy(source: Path, name: str) -> Path:
        target = root / name
        shutil.copytree(source, target, symlinks=True)
        return target

    # ---- odd names --------------------------------------------------------------------------------
    def odd_out(name: str):
        return lambda: run([*TRAIN, "--out", root / name], accept_success=True)
    for label, name in (("unicode NFD", unicodedata.normalize("NFD", "rün-é")), ("emoji", "run-🙂"),
                        ("newline in name", "run\nx"), ("leading dash", "-run"), ("spaces", "my run  "),
                        ("255-byte name", "r" * 255)):
        yield f"train --out <{label}>", odd_out(name)
    yield "train --out <256-byte name>", lambda: run([*TRAIN, "--out", root / ("r" * 256)])
    yield "train --out ''", lambda: run([*TRAIN, "--out", ""], watch=[Path.cwd()])
    yield "analyze --out <the source run itself>", lambda: run(["analyze", run_, "--out", run_], watch=[run_])
    yield "analyze --out <a checkpoint inside the run>", lambda: run(
        ["analyze", run_, "--out", current_checkpoint(run_).folder], watch=[run_])
    yield "docs --out <the study's figures/>", lambda: run(["docs", study, "--out", study / "figures"], watch=[study])
    yield "report <a run folder, not a study>", lambda: run(["report", run_], watch=[run_])
    yield "train --out <the study folder's runs/>", lambda: run([*TRAIN, "--out", study / "runs"], watch=[study])

    def nfc_twin():
        folder = copy(run_, "nfc-twin")
        faults.list_in_manifest(folder, "discard", unicodedata.normalize("NFD", "notés.md"))
        (folder / unicodedata.normalize("NFC", "notés.md")).write_text("the user's, NFC-named")
        return run([*TRAIN, "--resume", "--out", folder], watch=[folder / unicodedata.normalize("NFC", "notés.md")],
                   accept_success=True)
    yield "resume, discard names an NFD twin of a user's NFC file", nfc_twin

    def empty_user_folder_in_discard():
        folder = copy(run_, "discard-empty-folder")
        (folder / "my-empty-folder").mkdir()
        faults.list_in_manifest(folder, "discard", "my-empty-folder")
        outcome = run([*TRAIN, "--resume", "--out", folder], accept_success=True)
        return ("lost", "the user's empty folder was removed") if not (folder / "my-empty-folder").is_dir() else outcome
    yield "resume, discard names a user's empty folder", empty_user_folder_in_discard

    for name in (".lock", "manifest.json", "config.json/", "checkpoint-00000004/../config.json"):
        def listed(name=name):
            folder = copy(run_, f"listed-{abs(hash(name)) % 10 ** 6}")
            watch = [current_checkpoint(folder).folder, folder / "config.json"]
            faults.list_in_manifest(folder, "discard", name)
            return run([*TRAIN, "--resume", "--out", folder], watch=watch)
        yield f"resume, discard {name!r}", listed

    # ---- links ------------------------------------------------------------------------------------
    def hardlinked_backup():  # `cp -al run backup` (or rsync --link-dest): a backup sharing the run's inodes
        folder = root / "hardlinked"
        faults.kill_while_writing(lambda: hostile_inputs_cli_status([*TRAIN8, "--resume", "--out", folder]), folder,
                                  0.2)
        backup = root / "hardlinked-backup"
        subprocess.run(["cp", "-al", str(folder), str(backup)], check=True)
        before = digest_tree(backup)
        outcome = run([*TRAIN8, "--resume", "--out", folder], accept_success=True)
        if digest_tree(backup) != before:
            return "lost", "the hard-linked backup changed as the run was resumed"
        return outcome
    yield "resume a run that a `cp -al` backup shares inodes with", hardlinked_backup

    def linked_parent():
        (root / "elsewhere").mkdir()
        (root / "via-link").symlink_to(root / "elsewhere")
        return run([*TRAIN, "--out", root / "via-link" / "run"], accept_success=True)
    yield "train --out <below a linked parent the user made>", linked_parent

    def cache_is_link():
        target = root / "real-cache"
        target.mkdir()
        (root / "cache-link").symlink_to(target)
        with token_cache(root / "cache-link"):
            return run([*TRAIN, "--out", root / "cache-link-run"])
    yield "HEADLAB_CACHE a symbolic link", cache_is_link

    def cache_env(value: str, name: str):
        def attack():
            scratch = root / f"cwd-{name}"
            scratch.mkdir()
            (scratch / "mine.txt").write_text("the user's")
            with token_cache(value), contextlib.chdir(scratch):
                outcome = run([*TRAIN, "--out", root / f"cache-{name}-run"], accept_success=True)
                strays = sorted(p.name for p in scratch.iterdir() if p.name != "mine.txt")
                return ("wrong", f"the cache went into the working folder: {strays}") if strays else outcome
        return attack
    yield "HEADLAB_CACHE='' (an empty export)", cache_env("", "empty")
    yield "HEADLAB_CACHE=' ' (a space)", cache_env(" ", "space")

    def cache_is_file():
        (root / "cache-file").write_text("not a folder")
        with token_cache(root / "cache-file"):
            return run([*TRAIN, "--out", root / "cache-file-run"], watch=[root / "cache-file"])
    yield "HEADLAB_CACHE a file", cache_is_file

    def shard_meta_link():
        with token_cache(root / "cache-meta-link"):
            main([*TRAIN, "--steps", "1", "--checkpoint-every", "1", "--eval-every", "1"])
            shards = next((root / "cache-meta-link" / "tokens-sha256").iterdir())
            saved = root / "meta-saved.json"
            shutil.move(shards / "meta.json", saved)
            (shards / "meta.json").symlink_to(saved)
            return run([*TRAIN, "--out", root / "meta-link-run"], watch=[saved])
    yield "token cache meta.json replaced by a link", shard_meta_link

    # ---- permissions: a read-only folder, a file-size limit -----------------------------------------
    def read_only(command: str):
        def attack():
            target = copy(study if command in ("report", "reproduce") else run_, f"ro-{command}")
            argv = {"report": ["report", target], "resume": [*TRAIN, "--resume", "--out", target],
                    "analyze": ["analyze", target, "--out", target / "analysis"],
                    "reproduce": ["reproduce", "--preset", "tiny", "--corpus", "synthetic", "--steps", "4", "--seeds",
                                  "1", "--only", "mha", "mla", "--jobs", "1", "--out", target]}[command]
            with ReadOnly(target):
                return run(argv, watch=[target])
        return attack
    for command in ("report", "resume", "analyze", "reproduce"):
        yield f"{command} into a read-only folder (bind mount)", read_only(command)

    def read_only_cache():
        (root / "ro-cache").mkdir()
        with token_cache(root / "ro-cache"), ReadOnly(root / "ro-cache"):
            return run([*TRAIN, "--out", root / "ro-cache-run"])
    yield "train with a read-only token cache", read_only_cache

    def size_limited(command: str, limit: int):
        def attack():
            box = root / f"fsize-{command}-{limit}"
            target = box / "target"
            box.mkdir()
            if command != "resume8":  # resume8 trains from nothing under the limit
                shutil.copytree(study if command in ("report", "docs") else run_, target, symlinks=True)
            argv = {"report": ["report", target], "docs": ["docs", target, "--out", box / "docs"],
                    "resume8": [*TRAIN8, "--resume", "--out", target],
                    "analyze": ["analyze", target, "--out", box / "analysis"]}[command]
            before = treediff.Tree.read(box)
            status, err = faults.with_file_size_limit(lambda: hostile_inputs_cli_status(argv), limit)
            broken = treediff.check(before, treediff.Tree.read(box), status, err)
            if broken:
                return ("traceback" if status not in (0, 2, 130) or "one line" in broken[0] else "lost"), broken[0]
            lines = err.strip().splitlines()
            return "ok", lines[0][:150] if lines else "done"
        return attack
    for command, limit in (("report", 30_000), ("docs", 100), ("resume8", 50_000), ("analyze", 5_000)):
        yield f"{command} under a {limit}-byte file-size limit", size_limited(command, limit)

    def fsize_then_resume():
        folder = root / "fsize-resume"
        argv = [*TRAIN8, "--resume", "--out", folder]
        faults.with_file_size_limit(lambda: hostile_inputs_cli_status(argv), 60_000)
        outcome = run(argv, accept_success=True)
        if outcome[0] != "ok":
            return outcome
        return ("ok", "identical weights") if same_weights(folder, reference8) else ("wrong", "weights differ")
    yield "train cut by a file-size limit, then resumed without it", fsize_then_resume

    def fresh_cache_fsize():
        with token_cache(root / "fsize-cache"):
            status, err = faults.with_file_size_limit(lambda: hostile_inputs_cli_status(
                [*TRAIN, "--out", root / "fsize-cache-run"]), 1000)
            lines = err.strip().splitlines()
            if status != 2 or len(lines) != 1:
                return "traceback", f"exit {status}: {lines[-2:]}"
            outcome = run([*TRAIN, "--out", root / "fsize-cache-run2"], accept_success=True)
            return outcome if outcome[0] != "ok" else ("ok", lines[0][:150])
    yield "token cache built under a 1000-byte file-size limit, then again", fresh_cache_fsize

    # ---- kills and concurrency ----------------------------------------------------------------------
    def killed(command: str, delay: float):
        def attack():
            if command == "report":
                target = copy(study, f"kill-report-{delay}")
                argv = ["report", target]
            elif command == "reproduce":
                target = copy(study, f"kill-reproduce-{delay}")
                argv = ["reproduce", "--preset", "tiny", "--corpus", "synthetic", "--steps", "4", "--seeds", "1",
                        "--only", "mha", "mla", "--jobs", "1", "--out", target]
            else:
                target = root / f"kill-train-{delay}"
                argv = [*TRAIN8, "--resume", "--out", target]
            faults.kill_while_writing(lambda: hostile_inputs_cli_status(argv), target, delay)
            outcome = run(argv, accept_success=True)
            if outcome[0] != "ok":
                return outcome
            if command == "train":
                return ("ok", "identical weights") if same_weights(target, reference8) else ("wrong", "weights differ")
            again = run(["report", target], accept_success=True)
            return again
        return attack
    for command, delay in (("train", 0.1), ("report", 0.3), ("reproduce", 1.0), ("report", 0.0)):
        yield f"kill -9 during {command} ({delay} s in), then again", killed(command, delay)

    def concurrent(argv_a, argv_b, name):
        def attack():
            pid, read = faults.in_child(lambda: hostile_inputs_cli_status(argv_a)[0])
            time.sleep(0.3)
            second = run(argv_b, accept_success=True)
            os.close(read)
            _, status = os.waitpid(pid, 0)
            return second if os.WEXITSTATUS(status) in (0, 2) else ("traceback", f"first exited {status}")
        return attack
    yield "two reports of one study at once", concurrent(["report", study], ["report", study], "reports")
    yield "two trainers into one new --out at once", concurrent([*TRAIN, "--out", root / "both"],
                                                                [*TRAIN, "--out", root / "both"], "trainers")
    yield "docs while a reproduce rewrites the study", concurrent(
        ["reproduce", "--preset", "tiny", "--corpus", "synthetic", "--steps", "4", "--seeds", "1", "--only", "mha",
         "mla", "--jobs", "1", "--out", study], ["docs", study, "--out", root / "docs-during"], "docs")

    def concurrent_cache():
        with token_cache(root / "race-cache"):
            pid, read = faults.in_child(lambda: hostile_inputs_cli_status([*TRAIN, "--out", root / "race-a"])[0])
            outcome = run([*TRAIN, "--out", root / "race-b"], accept_success=True)
            os.close(read)
            os.waitpid(pid, 0)
            leftovers = [p.name for p in (root / "race-cache" / "tokens-sha256").iterdir() if p.name.startswith(".")]
            if leftovers:
                return "wrong", f"scratch folders left: {leftovers}"
            return outcome if outcome[0] != "ok" else (
                ("ok", "same weights") if same_weights(root / "race-a", root / "race-b") else ("wrong", "differ"))
    yield "two trainers tokenizing one new corpus at once", concurrent_cache

    # ---- partial files ------------------------------------------------------------------------------
    def partial(where: str, keep: int, command: str):
        def attack():
            target = copy(study if command == "report" else run_, f"partial-{abs(hash((where, keep))) % 10 ** 6}")
            path = target / where if where != "<checkpoint>" else current_checkpoint(target).folder / "state.pt"
            faults.truncate(path, keep)
            argv = ["report", target] if command == "report" else [*TRAIN, "--resume", "--out", target]
            if where != "starts.jsonl":
                return run(argv, watch=[target / "notes.md"])
            outcome = run(argv, accept_success=True)  # a log for people: resumed, its new record whole
            last = path.read_text().splitlines()[-1]
            return outcome if last.startswith('{"step"') and last.endswith("}") else ("wrong", f"log ends {last!r}")
        return attack
    for where, keep, command in (("study.json", 200, "report"), ("training.csv", 30, "report"),
                                 ("<checkpoint>", 1000, "resume"), ("starts.jsonl", 5, "resume")):
        yield f"{where} cut to {keep} bytes, then {command}", partial(where, keep, command)

    def corpus_grows():
        text = root / "growing.txt"
        text.write_text("words and more words. " * 400)
        first = run([*TRAIN, "--corpus", text, "--out", root / "grow-a"], accept_success=True)
        with open(text, "a") as f:
            f.write("appended later. " * 50)
        outcome = run([*TRAIN, "--corpus", text, "--out", root / "grow-a", "--resume"])
        return outcome if first[0] == "ok" else first
    yield "resume after the text corpus grew", corpus_grows

    def corpus_file_swap():
        folder = root / "swap-corpus"
        folder.mkdir()
        (folder / "a.txt").write_text("alpha text " * 300)
        (folder / "b.txt").write_text("beta words " * 300)
        run([*TRAIN, "--corpus", folder, "--out", root / "swap-a"], accept_success=True)
        faults.swap(folder / "a.txt", folder / "b.txt")
        return run([*TRAIN, "--corpus", folder, "--out", root / "swap-a", "--resume"])
    yield "resume after two corpus files swapped names", corpus_file_swap


def hostile_inputs_cli_status(argv) -> tuple[int, str]:
    """(exit status, stderr) of `headlab argv` in this process (for forked children)."""
    import contextlib
    import io as text_io
    err = text_io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(text_io.StringIO()):
        try:
            status = main([str(a) for a in argv])
        except SystemExit as exit_:
            status = exit_.code
        except BaseException as error:  # counted as what it is: a traceback
            return 1, f"{type(error).__name__}: {error}"
    return status, err.getvalue()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="scratch folder (default: a temporary one, deleted after)")
    parser.add_argument("--only", help="run the attacks whose name contains this text")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["HEADLAB_CACHE"] = str(Path(scratch) / "cache")
        root = (args.out or Path(scratch) / "attack").resolve()
        root.mkdir(parents=True, exist_ok=True)
        for name, attack in attacks(root):
            if args.only and args.only not in name:
                continue
            try:
                outcome = attack()
            except BaseException as error:  # the attack's own set-up met what it attacks
                outcome = ("traceback", f"{type(error).__name__}: {error}"[:200])
            results.append((name, *outcome))
            print(f"{outcome[0]:<10} {name:<62} {outcome[1][:100]}", flush=True)
    counts = Counter(kind for _, kind, _ in results)
    print(f"\n{len(results)} attacks: " + ", ".join(f"{counts[k]} {k}" for k in CLASSES))
    print(hashlib.sha256(json.dumps(results).encode()).hexdigest()[:12])
    sys.exit(0 if counts["ok"] == len(results) else 1)
