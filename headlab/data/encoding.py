"""Tokenizing a stream of texts in parallel: batches of about a MiB of text go to worker
processes and come back in order, so the tokens are the same whatever the number of workers,
and at most two batches per worker are in flight, so memory stays bounded whatever the corpus."""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from itertools import chain, islice
from multiprocessing import get_all_start_methods, get_context
from typing import Iterable, Iterator

import numpy as np

BATCH_BYTES = 1 << 20  # of text per task: large enough that pickling is noise, small enough to stream
# Workers are forked where the platform can (Linux): a forked worker starts in milliseconds with
# the parent's modules, while a spawned one re-imports the parent's main module, hence torch
# (seconds and ~500 MB each, which made two workers slower than one). A fork inherits the
# parent's torch and gloo threads only as dead copies, and a worker never calls into either: it
# runs numpy and the tokenizer libraries alone (Hugging Face `tokenizers` turns its own thread
# pool off in a forked child by itself).
WORKER_START = "fork" if "fork" in get_all_start_methods() else "spawn"


def available_cores() -> int:
    """The cores this process may run on (its affinity, e.g. under a batch scheduler)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def encode_texts(texts: Iterable[str], tokenizer, workers: int = 1,
                 documents: bool = False) -> Iterator[tuple[bytes, int]]:
    """(token bytes, UTF-8 bytes of text) of consecutive batches of `texts`, in order. With
    `documents`, every text is followed by the tokenizer's end-of-text token. `workers` > 1
    start worker processes only for a tokenizer whose `encode_in_workers` says it gains from them."""
    if documents and getattr(tokenizer, "end_of_text", None) is None:
        raise ValueError(f"tokenizer {tokenizer.name!r} has no end-of-text token to separate documents")
    batches = _batches(texts)
    head = list(islice(batches, 2))
    if workers == 1 or len(head) < 2 or not tokenizer.encode_in_workers:  # one batch is not worth processes
        yield from (encode_batch(tokenizer, batch, documents) for batch in chain(head, batches))
        return
    with ProcessPoolExecutor(workers, mp_context=get_context(WORKER_START), initializer=_use_tokenizer,
                             initargs=(tokenizer,)) as pool:
        pending = deque()
        for batch in chain(head, batches):
            pending.append(pool.submit(_encode_in_worker, batch, documents))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


_worker_tokenizer = None  # a worker process's tokenizer, sent once rather than with every batch


def _use_tokenizer(tokenizer) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tokenizer


def _encode_in_worker(texts: list[str], documents: bool) -> tuple[bytes, int]:
    return encode_batch(_worker_tokenizer, texts, documents)


def encode_batch(tokenizer, texts: list[str], documents: bool) -> tuple[bytes, int]:
    pieces, n_bytes = [], 0
    end = np.array([tokenizer.end_of_text], dtype=tokenizer.dtype) if documents else None
    for text in texts:
        pieces.append(tokenizer.encode(text))
        if documents:
            pieces.append(end)
        n_bytes += len(text.encode("utf-8"))
    return (np.concatenate(pieces).astype(tokenizer.dtype, copy=False).tobytes() if pieces else b""), n_bytes


def _batches(texts: Iterable[str]) -> Iterator[list[str]]:
    batch, size = [], 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
