"""StepGC (decision 66): cyclic garbage is collected only at the step boundaries it names, and the interpreter's
collector is left as it was found."""

from __future__ import annotations

import gc
import weakref

import pytest

from tidal.core.errors import TidalError
from tidal.runtime.gcsync import FULL_EVERY, StepGC

pytestmark = pytest.mark.unit


class _Node:
    pass


def _cycle() -> weakref.ref:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def auto_gc():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_cycles_wait_for_the_named_boundaries(auto_gc):
    with StepGC(3) as sgc:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        ref = _cycle()
        for _ in range(3):  # without automatic collection the cycle survives any amount of allocation in a step
            [_Node() for _ in range(5000)]
        assert ref() is not None
        assert sgc.after_step(1) == 0.0 and sgc.after_step(2) == 0.0 and ref() is not None
        assert sgc.after_step(3) >= 0.0 and ref() is None  # collected at step 3's boundary
        ref = _cycle()
        sgc.after_step(4)
        assert ref() is not None
        sgc.after_step(6)
        assert ref() is None
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_old_cycles_wait_for_the_full_collection(auto_gc):
    """A cycle that outlived one collection sits in the old generation: only every FULL_EVERY-th one frees it."""
    with StepGC(1) as sgc:
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        ref = weakref.ref(a)
        sgc.after_step(1)  # still referenced: promoted to the old generation
        del a, b
        for step in range(2, FULL_EVERY):
            sgc.after_step(step)
            assert ref() is not None, step
        sgc.after_step(FULL_EVERY)
        assert ref() is None


def test_state_restored_on_error_and_when_disabled_before(auto_gc):
    with pytest.raises(RuntimeError), StepGC(1):
        raise RuntimeError("step failed")
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()
    with StepGC(1):
        pass
    assert not gc.isenabled()  # a collector the caller had turned off stays off
    gc.enable()


def test_zero_leaves_the_automatic_collector(auto_gc):
    with StepGC(0) as sgc:
        assert gc.isenabled() and gc.get_freeze_count() == 0
        assert sgc.after_step(1) == 0.0
    assert gc.isenabled()
    assert StepGC(2).after_step(2) == 0.0  # outside the context: nothing to do


@pytest.mark.parametrize("every", [-1, 1.5, True, "2"])
def test_bad_every_is_one_line(every):
    with pytest.raises(TidalError, match="gc_every must be an integer >= 0"):
        StepGC(every)
