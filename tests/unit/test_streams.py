"""The pull and push streams' posting rules (runtime/streams.py, decision 75) with stand-in plans: posting order, the
windows, send-only pull groups outside the window, and a push that never blocks before finish()."""

import pytest

from tidal.core.errors import TidalError
from tidal.runtime.streams import PullStream, PushStream

pytestmark = pytest.mark.unit


class _Fake:
    """A posted group: `done` says whether its operations completed; wait() is logged (and refused when `forbid`)."""

    def __init__(self, log, g, forbid=None):
        self.log, self.g, self.done, self.forbid = log, g, False, forbid

    def poll(self):
        return self.done

    def wait(self):
        if self.forbid is not None and self.forbid():
            raise AssertionError(f"blocking wait on group {self.g}")
        self.log.append(("wait", self.g))
        return [self.g]

    def finish_polled(self):
        assert self.done
        self.log.append(("polled", self.g))
        return [self.g]


def _pull(receives, window):
    log, posted = [], {}

    def post(g):
        log.append(("post", g))
        posted[g] = _Fake(log, g)
        return posted[g]

    return PullStream(receives, window, post, lambda g, outs: log.append(("land", g))), log


def test_pull_window_counts_only_groups_received_into():
    # a later-stage rank: groups 0-2 only sent from, 3-6 received into, 7-8 only sent from
    receives = [False] * 3 + [True] * 4 + [False] * 2
    s, log = _pull(receives, 2)
    assert [g for k, g in log if k == "post"] == [0, 1, 2, 3, 4]  # every send-only group before its own, then 2
    assert not s.all_posted
    s.need(3)  # its first module: groups 0-3 complete in order, each completion posting what the window frees
    assert [e for e in log if e[0] != "land"][5:] == [("wait", 0), ("wait", 1), ("wait", 2), ("wait", 3), ("post", 5)]
    s.need(4)
    assert ("post", 6) in log and ("post", 7) in log and ("post", 8) in log  # after the last own group: the rest
    assert s.all_posted
    s.finish()
    assert [g for k, g in log if k == "wait"] == list(range(9)) and [g for k, g in log if k == "land"] == list(range(9))


def test_pull_window_one_and_bad_window():
    s, log = _pull([True, True, True], 1)
    assert [g for k, g in log if k == "post"] == [0]
    s.finish()
    assert [k for k, _ in log] == ["post", "wait", "land", "post", "wait", "land", "post", "wait", "land"]
    with pytest.raises(TidalError, match="window"):
        _pull([True], 0)


def _push(holds, window, gate=lambda: True):
    log, posted, state = [], {}, {"backward": True}

    def post(q):
        log.append(("post", q))
        posted[q] = _Fake(log, q, forbid=lambda: state["backward"])
        return posted[q]

    s = PushStream(holds, window, post, lambda q, outs: log.append(("land", q)), gate=gate)
    return s, log, posted, state


def test_push_posts_final_groups_in_order_without_blocking():
    s, log, posted, state = _push([True, True, False, True], 2)
    s.advance()
    assert log == []  # group 0 not final yet: nothing may be posted out of order
    s.final(1)
    assert log == []
    s.final(0)
    assert log == [("post", 0), ("post", 1)]  # window of 2 full; group 2 (no gradient here) waits for room
    s.advance()
    assert log == [("post", 0), ("post", 1)]  # still in flight: polled, never waited
    posted[0].done = True
    s.advance()
    assert log[2:] == [("polled", 0), ("land", 0), ("post", 2)]
    state["backward"] = False
    s.finish()  # the rest in order, blocking now
    assert [e for e in log if e[0] in ("land",)] == [("land", q) for q in range(4)]
    assert s.posted_in_backward == 3
    assert [e for e in log if e[0] == "wait"] == [("wait", 1), ("wait", 2), ("wait", 3)]


def test_push_waits_for_the_whole_pull_to_be_posted():
    gate = {"open": False}
    s, log, _, state = _push([True], 2, gate=lambda: gate["open"])
    s.final(0)
    assert log == []
    gate["open"] = True
    s.advance()
    assert log == [("post", 0)]
    s2, _, _, _ = _push([True], 1, gate=lambda: False)
    with pytest.raises(TidalError, match="pull"):
        s2.finish()
