"""collecting_only_what_is_made_within: the cyclic collector passes over what was alive on entry,
finds the garbage made within, and gives every object back when the outermost block ends."""

import gc
import weakref

from headlab.training.trainer import collecting_only_what_is_made_within


class Node:
    pass


def cycle() -> weakref.ref:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_garbage_made_within_is_collected_and_what_was_frozen_is_given_back():
    gc.disable()  # no automatic collection between the explicit ones
    try:
        old = cycle()  # garbage from before the block: frozen with everything else alive on entry
        with collecting_only_what_is_made_within():
            with collecting_only_what_is_made_within():
                pass
            assert gc.get_freeze_count() > 0  # an inner block leaves the outer one's freeze in place
            new = cycle()
            gc.collect()
            assert new() is None and old() is not None
        assert gc.get_freeze_count() == 0
        gc.collect()
        assert old() is None
    finally:
        gc.enable()
