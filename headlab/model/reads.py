"""Which settings a model reads: the ModelConfig fields that `GPT(config)` looks at while it builds
its modules, recorded as it builds them (on the meta device: no weights are made), so what a
family reads is what its code reads, never a list kept beside it.

    fields_read(preset("tiny", "mha"))   # frozenset({'vocab_size', 'n_head', ...}): no 'n_kv_head'

Every module reads its settings as it is built and keeps them (LRKV its residual scale too), so
construction sees every read; tests/model/test_config.py checks that a field outside the set
leaves the model's weights and outputs as they were.
"""

from __future__ import annotations

import functools
from dataclasses import fields

from headlab.model.config import ModelConfig
from headlab.model.gpt import build_on_meta


@functools.lru_cache(maxsize=256)
def fields_read(config: ModelConfig) -> frozenset[str]:
    """The fields of `config` that a GPT of it reads while it is built (its shape, its family's
    knobs, its initialisation): a field outside this set changes nothing in the model."""
    read: set[str] = set()
    build_on_meta(recording(config, read))
    return frozenset(read)


def recording(config, read: set[str]):
    """A copy of dataclass `config` (the same values, validated already) that adds the name of each
    of its fields to `read` when it is looked up."""
    names = frozenset(f.name for f in fields(config))

    class Reading(type(config)):
        def __getattribute__(self, name):
            if name in names:
                read.add(name)
            return object.__getattribute__(self, name)

    probe = object.__new__(Reading)
    for name in names:
        object.__setattr__(probe, name, getattr(config, name))
    return probe
