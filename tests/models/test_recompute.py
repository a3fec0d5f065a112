"""Activation recomputation and offload (models/recompute.py, decision 90): gradients equal the run without them in
float64 (rtol 1e-12, atol 1e-14), the saved activations shrink as the modes say, forward pre-hooks that fire again
in a recomputation are harmless for the executor's pull stream, and the CPU offload path runs and moves nothing."""

import pytest
import torch

from tidal.core import TidalError, get_model
from tidal.models import Llama, VarlenBatch, loss_sum
from tidal.runtime.streams import PullStream

pytestmark = pytest.mark.unit
LENGTHS = [37, 5, 22]


def _model(modes=None, offload=(), backend="sdpa"):
    torch.manual_seed(3)
    m = Llama(get_model("tiny"), backend).to(torch.float64)
    m.set_recompute(modes, offload)
    return m


def _data(spec):
    g = torch.Generator().manual_seed(5)
    n = sum(LENGTHS)
    return (torch.randint(0, spec.vocab, (n,), generator=g), torch.randint(0, spec.vocab, (n,), generator=g),
            VarlenBatch.from_lengths(LENGTHS))


def _grads(model, count=None):
    x, y, batch = _data(model.spec)
    if count is None:
        loss = loss_sum(model(x, batch), y)
    else:
        with torch.autograd.graph.saved_tensors_hooks(count.pack, lambda t: t):
            loss = loss_sum(model(x, batch), y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


class _Count:
    """Bytes of distinct storages autograd saves (parameters excluded)."""

    def __init__(self, model):
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.seen = {}

    def pack(self, t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self.params:
            self.seen[ptr] = max(self.seen.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    @property
    def total(self):
        return sum(self.seen.values())


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
@pytest.mark.parametrize("modes", ["full", "selective", {0: "full", 2: "selective", 5: "full"}])
def test_recompute_keeps_gradients_exact(modes, backend):
    loss0, g0 = _grads(_model(None, backend=backend))
    loss1, g1 = _grads(_model(modes, backend=backend))
    assert torch.equal(loss0, loss1) or torch.allclose(loss0, loss1, rtol=1e-12, atol=0)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-12, atol=1e-14, msg=name)


def test_saved_bytes_shrink_by_mode():
    totals = {}
    for mode in ("none", "selective", "full"):
        m = _model(mode, backend="reference")  # the reference backend saves its [Tq, Tk] probabilities
        c = _Count(m)
        _grads(m, c)
        totals[mode] = c.total
    assert totals["full"] < totals["selective"] < totals["none"]
    spec, n = get_model("tiny"), sum(LENGTHS)
    # full keeps only each layer's input (float64 [T, hidden]) besides the embedding/head and cos/sin
    layer_inputs = spec.layers * n * spec.hidden * 8
    assert totals["full"] < layer_inputs + totals["none"] / spec.layers


def test_pre_hooks_fire_again_and_the_pull_is_not_repeated():
    m = _model("full")
    log, calls = [], []
    groups = len(m.layers) + 2

    class _Done:
        def __init__(self, g):
            self.g = g

        def wait(self):
            log.append(("wait", self.g))
            return []

    stream = PullStream([True] * groups, 2, lambda g: _Done(g), lambda g, outs: log.append(("land", g)))
    def hook(g):
        calls.append(g)
        stream.need(g)

    for i, layer in m.layers.items():
        layer.register_forward_pre_hook(lambda _m, _a, g=int(i) + 1: hook(g))
    _grads(m)
    assert calls == list(range(1, 7)) + list(range(6, 0, -1))  # forward, then each layer again in the backward
    assert [g for k, g in log if k == "land"] == list(range(7))  # each group landed once, in order
    assert [g for k, g in log if k == "wait"] == list(range(7))


def test_offload_on_cpu_is_an_exercised_no_op():
    loss0, g0 = _grads(_model(None))
    m = _model({1: "selective", 3: "full"}, offload=(1, 3, 4))
    loss1, g1 = _grads(m)
    assert torch.equal(loss0, loss1)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-12, atol=1e-14, msg=name)
    hooks = {i: m.layers[str(i)].offload for i in (1, 3, 4)}
    assert all(h.packed > 0 for h in hooks.values()) and all(h.moved == 0 for h in hooks.values())
    assert m.layers["0"].offload is None


def test_bad_recompute_options():
    m = _model()
    with pytest.raises(TidalError, match="recompute must be one of"):
        m.set_recompute("some")
    with pytest.raises(TidalError, match="does not hold"):
        m.set_recompute({9: "full"})
    with pytest.raises(TidalError, match="offload names layers"):
        m.set_recompute("none", offload=(7,))
