"""Tokenizing local document corpora: MB/s and tokens/s per format and worker count, and the
peak memory of preparing shards from a corpus larger than 2 GB.

    python benchmarks/tokenization.py [--quick] [--megabytes N] [--rss-gigabytes G]

Text is generated in a temporary folder (seeded words, documents of 1-8 KB) and written as
.parquet, .jsonl, .jsonl.gz and .jsonl.zst. Each format is tokenized into shards (reading,
tokenizing and writing included) by 1 and 2 worker processes with the trained BPE route
(`bpe:8192`, trained once beforehand) and the byte route; GPT-2 (tiktoken) too when its BPE
files are available offline. Targets: >= 1 M tokens/s per core, >= 1.7x from 1 to 2 workers.
The memory row runs `load_corpus` on a > 2 GB .jsonl corpus in a child process and reports the
peak RSS of it and of its largest worker (target <= ~1 GB).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    from benchmarks import common
except ImportError:  # run as a script
    import common

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from headlab.data.bpe import BPETokenizer
from headlab.data.shards import write_shards
from headlab.data.sources import document_files, document_texts
from headlab.data.tokenizers import get_tokenizer
from headlab.io import ScratchFolder

FORMATS = ("parquet", "jsonl", "jsonl.gz", "jsonl.zst")
TOKENS_PER_CORE = 1e6
SCALING = 1.7
RSS_TARGET = 1 << 30


def documents(megabytes: float, seed: int = 0):
    generator = random.Random(seed)
    words = ["".join(generator.choices("abcdefghijklmnopqrstuvwxyz", k=generator.randint(1, 9))) for _ in range(20000)]
    written = 0
    while written < megabytes * 1e6:
        text = " ".join(generator.choices(words, k=generator.randint(200, 1400))) + "."
        written += len(text)
        yield text


def write_corpus(folder: Path, texts: list[str], kind: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"part-0.{kind}"
    if kind == "parquet":
        pq.write_table(pa.table({"text": texts}), path, row_group_size=1000)
        return path
    lines = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    path.write_bytes(gzip.compress(lines, 6) if kind.endswith("gz") else
                     zstandard.ZstdCompressor().compress(lines) if kind.endswith("zst") else lines)
    return path


def tokenizers(texts: list[str]) -> dict:
    found = {"byte": get_tokenizer("byte"),
             "bpe:8192": BPETokenizer.train(texts[: max(1, len(texts) // 10)], 8192, end_of_text=True)}
    try:
        found["gpt2"] = get_tokenizer("gpt2")
    except RuntimeError:
        pass  # tiktoken downloads GPT-2's BPE files once; an offline machine without them skips it
    return found


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the tokenizing workers)."""
    return sum(getattr(resource.getrusage(who), field) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for field in ("ru_utime", "ru_stime"))


def time_shards(folder: Path, tokenizer, workers: int, out: Path) -> tuple[float, float, int, int]:
    """Wall seconds, CPU seconds, text bytes and tokens of writing `folder`'s shards."""
    files = document_files(str(folder))
    start, start_cpu = time.perf_counter(), cpu_seconds()
    with ScratchFolder(out) as scratch:
        write_shards(document_texts(files, "train"), tokenizer, scratch, val_texts=document_texts(files, "val"),
                     workers=workers, documents=True)
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - start_cpu
    meta = json.loads((out / "meta.json").read_text())
    n_bytes = sum(len(t.encode()) for t in document_texts(files, "train")) + sum(
        len(t.encode()) for t in document_texts(files, "val"))
    n_tokens = sum((out / f).stat().st_size for split in meta["shards"].values() for f in split) // (
        1 if meta["dtype"] == "uint8" else 2)
    return seconds, cpu, n_bytes, n_tokens


PEAK_RSS_CHILD = """
import json, resource, sys
from headlab.data.corpus import load_corpus
corpus = load_corpus(sys.argv[1], "byte", workers=int(sys.argv[2]))
print(json.dumps({"tokens": corpus.n_train_tokens + corpus.n_val_tokens,
                  "self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "workers": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
"""


def peak_rss(gigabytes: float, workers: int = 2) -> dict:
    """Prepare byte shards of a generated .jsonl corpus of `gigabytes` in a child process."""
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus"
        corpus.mkdir()
        block = "".join(json.dumps({"text": t}) + "\n" for t in documents(64)).encode()
        with open(corpus / "big.jsonl", "wb") as f:
            for _ in range(int(gigabytes * 1e9 / len(block)) + 1):
                f.write(block)
        size = (corpus / "big.jsonl").stat().st_size
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", PEAK_RSS_CHILD, str(corpus), str(workers)], capture_output=True,
                              text=True, env={**os.environ, "HEADLAB_CACHE": str(Path(tmp) / "cache")})
        if done.returncode:
            raise RuntimeError(done.stderr[-2000:])
        return {**json.loads(done.stdout.splitlines()[-1]), "bytes": size, "seconds": time.perf_counter() - start}


def run(quick: bool = False, megabytes: float | None = None, rss_gigabytes: float | None = None) -> common.Report:
    megabytes = megabytes or (8 if quick else 64)
    texts = list(documents(megabytes))
    rows, misses = [], []
    with tempfile.TemporaryDirectory() as tmp:
        available = tokenizers(texts)
        for kind in FORMATS:
            folder = Path(tmp) / kind.replace(".", "-")
            write_corpus(folder, texts, kind)
            for name, tokenizer in available.items():
                rates = {}
                for workers in (1, 2):
                    seconds, cpu, n_bytes, n_tokens = time_shards(folder, tokenizer, workers,
                                                                  Path(tmp) / f"out-{kind}-{name}-{workers}")
                    rates[workers] = n_tokens / seconds
                    rows.append([kind, name, workers, f"{n_bytes / seconds / 1e6:.1f}",
                                 f"{n_tokens / seconds / 1e6:.2f}",
                                 f"{n_tokens / seconds / workers / 1e6:.2f}", f"{n_tokens / cpu / 1e6:.2f}",
                                 f"{cpu / seconds:.2f}"])
                if rates[1] < TOKENS_PER_CORE:
                    misses.append(f"tokenize {kind} {name}: {rates[1] / 1e6:.2f} M tokens/s on one core < 1")
                if rates[2] / rates[1] < SCALING:
                    misses.append(f"tokenize {kind} {name}: {rates[2] / rates[1]:.2f}x from 1 to 2 workers < {SCALING}")
                rows[-1].append(f"{rates[2] / rates[1]:.2f}x")
                rows[-2].append("")
    text = common.machine_header(f"Tokenization of local document corpora ({megabytes:.0f} MB of text per format)")
    text += "\n" + common.format_table(["format", "tokenizer", "workers", "MB/s", "M tokens/s", "M tokens/s/worker",
                                        "M tokens/CPU-s", "cores used", "2 vs 1"], rows)
    text += ("\n\n'cores used' is CPU seconds (all processes) per wall second: on a shared machine 2 workers can "
             "only scale as far as the cores they are given.")
    if "gpt2" not in available:
        text += "\n\nGPT-2 (tiktoken) skipped: its BPE files are not available offline on this machine."
    if rss_gigabytes:
        rss = peak_rss(rss_gigabytes)
        text += (f"\n\nShard preparation of a {rss['bytes'] / 1e9:.2f} GB .jsonl corpus (byte tokens, 2 workers): "
                 f"{rss['seconds']:.0f} s, peak RSS {rss['self'] / 2**20:.0f} MiB (preparing process), "
                 f"{rss['workers'] / 2**20:.0f} MiB (largest worker)")
        if max(rss["self"], rss["workers"]) > RSS_TARGET:
            misses.append(f"shard preparation peak RSS {max(rss['self'], rss['workers']) / 2**20:.0f} MiB > 1 GiB")
    return common.Report("tokenization", text, not misses, misses)


def main(argv=None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--megabytes", type=float, help="text per format (default: 64, quick: 8)")
    p.add_argument("--rss-gigabytes", type=float, help="also measure peak RSS on a generated corpus of this size")
    args = p.parse_args(argv)
    common.setup(args)
    report = run(args.quick, args.megabytes, args.rss_gigabytes)
    print(report)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
