"""What content verification costs (issue 22): SHA-256 while writing and on every read, for a
paper-128m-sized checkpoint (~1.5 GB of tensors: weights and AdamW moments) and a 1 GB token
cache, in MB/s and seconds (target: verifying reads at >= 200 MB/s).

    python benchmarks/verification_cost.py [--quick]

Random tensors in a temporary folder, written and read the way a run folder and the token cache
are (`headlab.io.Manifest`): the write hashes as it goes; the read verifies the whole content.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save as serialize_safetensors

from headlab.io import Manifest, atomic_write_bytes, file_digest

try:
    from benchmarks import common
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import common

CHECKPOINT_BYTES, CACHE_BYTES, SHARD_BYTES = 1_500_000_000, 1_000_000_000, 125_000_000
TARGET_MB_S = 200


def _timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def run(quick: bool = False, **_ignored) -> common.Report:
    scale = 10 if quick else 1
    rows, speeds = [], []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        manifest = Manifest.claim(folder, "manifest.json", "a benchmark folder")
        n = CHECKPOINT_BYTES // scale // 4 // 3
        tensors = {f"part{i}": torch.randn(n) for i in range(3)}  # weights and two AdamW moments
        data = serialize_safetensors(tensors)
        write = _timed(lambda: manifest.write("model.safetensors", lambda file: file.write(data)))
        read = _timed(lambda: manifest.read_bytes("model.safetensors"))
        rows.append(["checkpoint (write + hash)", f"{len(data) / 1e9:.2f} GB", f"{write:.2f}",
                     f"{len(data) / 1e6 / write:,.0f}"])
        rows.append(["checkpoint (read + verify)", f"{len(data) / 1e9:.2f} GB", f"{read:.2f}",
                     f"{len(data) / 1e6 / read:,.0f}"])
        speeds.append(len(data) / 1e6 / read)
        del data, tensors
        shard = torch.randint(0, 32767, (SHARD_BYTES // scale // 2,), dtype=torch.int16).numpy().tobytes()
        n_shards = CACHE_BYTES // SHARD_BYTES
        digests = {}
        write = _timed(lambda: digests.update({i: atomic_write_bytes(folder / f"train_{i:03d}.bin", shard)["sha256"]
                                               for i in range(n_shards)}))
        read = _timed(lambda: [file_digest(folder / f"train_{i:03d}.bin") == digests[i] or sys.exit("mismatch")
                               for i in range(n_shards)])
        size = n_shards * len(shard)
        rows.append(["token cache (write + hash)", f"{size / 1e9:.2f} GB", f"{write:.2f}",
                     f"{size / 1e6 / write:,.0f}"])
        rows.append(["token cache (verify)", f"{size / 1e9:.2f} GB", f"{read:.2f}", f"{size / 1e6 / read:,.0f}"])
        speeds.append(size / 1e6 / read)
    ok = min(speeds) >= TARGET_MB_S
    text = "\n".join([common.machine_header("SHA-256 verification of run folders and the token cache"
                                            + (" (quick: a tenth of the sizes)" if quick else "")), "",
                      common.format_table(["what", "size", "seconds", "MB/s"], rows),
                      f"target: verifying reads >= {TARGET_MB_S} MB/s; result: {common.verdict(ok)}"])
    return common.Report("verification_cost", text, ok, [] if ok else [f"verification_cost: {min(speeds):.0f} MB/s"])


if __name__ == "__main__":
    report = run(quick="--quick" in sys.argv)
    print(report)
    sys.exit(0 if report.passed else 1)
