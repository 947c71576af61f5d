"""Several torchrun-like ranks without torchrun: forked from the test process (so nothing is
imported again, a second per rank saved), each with torchrun's environment for one node, joined
into one gloo group by the code under test. Each rank's result comes back pickled."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import threading
import time
from typing import Callable

import torch.distributed as dist

from headlab.training.distributed import leave_process_group


class RankFailed(AssertionError):
    """A rank raised, died, or outlived the timeout."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _read_all(read: int, into: bytearray) -> None:
    with os.fdopen(read, "rb") as pipe:
        into.extend(pipe.read())


def on_ranks(work: Callable[[int], object], world_size: int = 2, timeout: float = 120, killed: bool = False) -> list:
    """[work(rank) for each rank], run at once in `world_size` forked processes of one node. A
    rank that raises returns the `Exception`'s "Type: message" line in place of its result (it
    leaves the group without the exit barrier, which its peers might never reach). With `killed`,
    every rank is expected to end without a result (as a kill ends it: `os._exit` inside `work`),
    and None is each one's result."""
    port, children = _free_port(), []
    for rank in range(world_size):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the rank: never returns into the caller's code
            status = 1
            try:
                os.close(read)
                os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                                  WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
                try:
                    result, failed = work(rank), False
                except Exception as error:
                    result, failed = RankFailed(f"{type(error).__name__}: {error}"), True
                with os.fdopen(write, "wb") as pipe:
                    pickle.dump(result, pipe)
                if failed and dist.is_initialized():
                    dist.destroy_process_group()
                else:
                    leave_process_group()
                status = 0
            finally:
                os._exit(status)
        os.close(write)
        children.append((pid, read))
    received = {pid: bytearray() for pid, _ in children}  # read as they come: a result may exceed a pipe's buffer
    readers = [threading.Thread(target=_read_all, args=(read, received[pid]), daemon=True) for pid, read in children]
    for reader in readers:
        reader.start()
    deadline, ended = time.monotonic() + timeout, {}
    while len(ended) < world_size and time.monotonic() < deadline:
        for pid, _ in children:
            if pid not in ended and os.waitpid(pid, os.WNOHANG)[0]:
                ended[pid] = True
        time.sleep(0.05)
    for pid, _ in children:
        if pid not in ended:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    for reader in readers:
        reader.join()
    results = [pickle.loads(received[pid]) if received[pid] else None for pid, _ in children]
    if len(ended) < world_size or (None in results) != killed or killed and any(results):
        raise RankFailed(f"{world_size - len(ended)} rank(s) still ran after {timeout} s; results: {results}")
    return results
