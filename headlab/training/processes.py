"""Which process of a torchrun job this one is, read from torchrun's environment, and whether it
has joined a process group: without torch, so that the command line's runner (headlab.cli.main),
which asks for every command, loads no torch for the commands that need none (`report`, `docs`).
Joining, leaving and failing together: headlab.training.distributed."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Processes:
    """This process's place in the job (one process: rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


class FailedOnAnotherRank(RuntimeError):
    """Another rank failed at a step the ranks take together; the message is that rank's error."""


def launched_processes() -> Processes:
    """The processes torchrun launched, from its environment (no process group needed)."""
    env = os.environ
    return Processes(int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_RANK", "0")))


def node_processes() -> int:
    """How many of the job's processes torchrun started on this node (1 outside torchrun)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """Whether this process is rank 0 of its job (the only process outside torchrun): the one that
    writes run and study folders and speaks to the user. Read from torchrun's environment, so the
    answer is the same before the process group is joined and after it is left."""
    return launched_processes().is_main


def in_process_group() -> bool:
    """Whether this process has joined a torch.distributed process group. The module is looked up,
    not imported: a process that never loaded it has joined none."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def abandon(status: int) -> None:
    """End this process now with `status`, without the exit barrier: after an error the other
    ranks may never reach it (torchrun stops them once one process has exited non-zero)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
