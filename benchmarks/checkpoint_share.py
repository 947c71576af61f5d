"""Share of training time spent checkpointing: every N steps against every M minutes
(TrainConfig.checkpoint_every against checkpoint_minutes), measured in one process.

The same run is trained twice into fresh folders, once per setting; each checkpoint's two parts are
timed where the run folder calls them: the gather of weights and optimizer states onto the host
(`gather_training_state`, which every rank joins and the others wait through) and the write that
follows (`save_checkpoint`: serialize, hash, fsync, replace the manifest). Share = (gather + write)
/ the run's wall time. Under every-N the share is the checkpoint cost over N steps' cost, so it grows
as steps get faster (the issue's 12-18 % of a compiled 8-GPU run); under every-M it is bounded by the
checkpoint cost over M minutes, whatever a step costs. The final step's checkpoint is in both.

    python benchmarks/checkpoint_share.py [--preset tiny] [--steps 120] [--every 5] [--minutes 0.05]
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

try:
    from benchmarks import common
except ImportError:  # run as a script: benchmarks/ itself is on sys.path
    import common

from headlab import preset
from headlab.data.corpus import load_corpus
from headlab.runs import folder as folder_module
from headlab.training.config import train_preset
from headlab.training.trainer import train


def timed_run(model_config, train_config, corpus, out: Path) -> dict:
    """Wall seconds of one training run into `out`, and the seconds and count of its checkpoints' parts."""
    spent = {"gather": 0.0, "write": 0.0, "checkpoints": 0}
    gather, save = folder_module.gather_training_state, folder_module.save_checkpoint

    def timed(part, call):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - start
                spent["checkpoints"] += part == "write"
        return run

    folder_module.gather_training_state, folder_module.save_checkpoint = timed("gather", gather), timed("write", save)
    try:
        start = time.perf_counter()
        train(model_config, train_config, corpus, out=out, progress=False)
        spent["wall"] = time.perf_counter() - start
    finally:
        folder_module.gather_training_state, folder_module.save_checkpoint = gather, save
    return spent


def main(argv=None) -> str:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--every", type=int, default=5, help="checkpoint_every of the step-count run")
    p.add_argument("--minutes", type=float, default=0.05, help="checkpoint_minutes of the time-interval run")
    args = p.parse_args(argv)
    common.setup(args)
    monitor = common.CpuMonitor()
    model_config = preset(args.preset, "mha")
    base = train_preset(args.preset, steps=args.steps, eval_every=args.steps, log_every=5, device="cpu")
    corpus = load_corpus("synthetic")
    settings = {f"every {args.every} steps": base.replace(checkpoint_every=args.every),
                f"every {args.minutes:g} min": base.replace(checkpoint_every=args.steps,
                                                            checkpoint_minutes=args.minutes)}
    rows, shares = [], []
    with tempfile.TemporaryDirectory() as folder:
        for i, (name, config) in enumerate(settings.items()):
            spent = timed_run(model_config, config, corpus, Path(folder) / f"run{i}")
            share = (spent["gather"] + spent["write"]) / spent["wall"]
            shares.append(share)
            rows.append([name, spent["checkpoints"], f"{spent['wall']:.1f}", f"{spent['gather']:.2f}",
                         f"{spent['write']:.2f}", f"{100 * share:.1f} %"])
    table = common.format_table(["checkpoints", "taken", "run s", "gather s", "write s", "share of run"], rows)
    title = f"Checkpoint share of training, {args.preset} MHA, {args.steps} steps"
    text = (common.machine_header(title, monitor=monitor)
            + f"\n\n{table}\n\nshare ratio (steps / minutes): {shares[0] / shares[1]:.1f}x")
    print(text)
    return text


if __name__ == "__main__":
    main()
