"""What `tidal train` prints while it runs (cli/steplog.py), model FLOPs and MFU (costmodel/flops.py), the metric
writers (cli/writers.py), console width when not a terminal (cli/render.py) and the torchrun launch check
(cli/multinode.py). All in-process, no ranks."""

import io

import pytest

from tidal.cli import render, steplog, writers
from tidal.cli.multinode import check_launch, torchrun_shape
from tidal.core.cluster import get_cluster
from tidal.core.errors import TidalError
from tidal.core.model import get_model, param_table
from tidal.costmodel.flops import mfu, peak_flops, train_flops
from tidal.runtime.config import TrainSection

pytestmark = pytest.mark.unit

ROW = {"step": 2, "loss": 5.43214, "tokens_per_s": 12345.6, "strategy": "tp2+2*tp1", "wall_s": 0.5219,
       "peak_mem_bytes": [3 * 2**30 // 2, 2**30, 2**29, 2**30], "mem_kind": "cuda", "mfu": 0.41234}


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_step_line_memory_per_rank_and_mfu():
    assert steplog.step_line(ROW, 20) == \
        "step 3/20 | loss 5.4321 | 12,346 tok/s | tp2+2*tp1 | mem 1.50 1.00 0.50 1.00 GiB | MFU 41.2% | 0.52 s"
    cpu = {**ROW, "mem_kind": "rss", "peak_mem_bytes": [2**30] * 7 + [2**31], "mfu": 0.00012}
    assert steplog.step_line(cpu, 20, nominal=True) == ("step 3/20 | loss 5.4321 | 12,346 tok/s | tp2+2*tp1 | "
                                                        "rss max 2.00 GiB (rank 7), min 1.00 GiB | "
                                                        "MFU 0.012% (nominal) | 0.52 s")
    bare = {k: v for k, v in ROW.items() if k not in ("peak_mem_bytes", "mfu")}
    assert steplog.step_line({**bare, "mfu": None}, 20) == "step 3/20 | loss 5.4321 | 12,346 tok/s | tp2+2*tp1 | 0.52 s"
    assert steplog.nominal_peak(get_cluster("cpux4")) and not steplog.nominal_peak(get_cluster("a800x16"))


def test_printer_writes_lines_and_rows():
    got = []

    class W:
        def write(self, row):
            got.append(row["step"])

    out = io.StringIO()
    on_step = steplog.printer(20, out, writers=[W()])
    on_step(ROW)
    on_step({**ROW, "step": 3})
    assert [x.split(" | ")[0] for x in out.getvalue().splitlines()] == ["step 3/20", "step 4/20"]
    assert got == [2, 3]
    steplog.writer_callback([W()])(ROW)  # progress = false: the writers alone
    assert got == [2, 3, 2]
    assert steplog.plain_output(io.StringIO()) and not steplog.plain_output(_Tty())
    err = io.StringIO()
    steplog.announcer(err, clock=lambda: 3600 * 5 + 61.5)("spawning 4 ranks")
    assert err.getvalue() == "[tidal 05:01:01] spawning 4 ranks\n"


def test_train_flops_against_the_parameter_table():
    """6 FLOPs per token per GEMM weight (embedding lookup and norms excluded, the head included) plus causal
    attention, 3 x 4h per (query, key) pair per layer; an independent count from param_table."""
    for name in ("tiny", "llama2-7b"):
        spec = get_model(name)
        gemm = sum(p.shape[0] * p.shape[1] for p in param_table(spec) if len(p.shape) == 2
                   and not (p.name == "tok_embeddings.weight" and not spec.tie_embeddings))
        lengths = [1, 7, 300]
        pairs = sum(n * (n + 1) // 2 for n in lengths)
        want = 6 * gemm * sum(lengths) + 3 * 4 * spec.hidden * spec.layers * pairs
        assert train_flops(spec, lengths) == pytest.approx(want, rel=1e-12)
    assert peak_flops(get_cluster("a800x16+h100x8")) == 16 * 312e12 + 8 * 989e12
    assert mfu(312e12, 2.0, 312e12) == 0.5 and mfu(1.0, 0.0, 1.0) is None and mfu(1.0, 1.0, 0.0) is None


class _FakeTB:
    """torch.utils.tensorboard's interface: SummaryWriter(log_dir=...).add_scalar/flush/close."""

    def __init__(self):
        self.calls = []
        fake = self

        class SummaryWriter:
            def __init__(self, log_dir):
                fake.calls.append(("init", log_dir))

            def add_scalar(self, tag, value, global_step):
                fake.calls.append((tag, value, global_step))

            def flush(self):
                fake.calls.append(("flush",))

            def close(self):
                fake.calls.append(("close",))

        self.SummaryWriter = SummaryWriter


class _FakeWandb:
    def __init__(self):
        self.calls = []
        fake = self

        class Run:
            def log(self, data, step):
                fake.calls.append(("log", data, step))

            def finish(self):
                fake.calls.append(("finish",))

        def init(**kw):
            fake.calls.append(("init", kw))
            return Run()

        self.init = init


def test_writers_log_every_numeric_field(tmp_path):
    tb, wb = _FakeTB(), _FakeWandb()
    mods = {"torch.utils.tensorboard": tb, "wandb": wb}
    section = TrainSection(tensorboard=str(tmp_path / "tb"), wandb="offline", wandb_dir=str(tmp_path))
    ws = writers.open_writers(section, {"a": 1}, importer=mods.__getitem__)
    row = {**ROW, "grad_norm": float("nan"), "skipped": True}
    for w in ws:
        w.write(row)
        w.close()
    assert tb.calls[0] == ("init", str(tmp_path / "tb"))
    scal = {c[0]: (c[1], c[2]) for c in tb.calls if c[0].startswith("train/")}
    assert scal["train/loss"] == (5.43214, 3) and scal["train/mfu"] == (0.41234, 3)
    assert scal["train/peak_mem_gib"] == (1.5, 3)
    assert "train/grad_norm" not in scal and "train/skipped" not in scal  # NaN and booleans are left out
    assert tb.calls[-2:] == [("flush",), ("close",)]
    assert wb.calls[0] == ("init", {"project": "tidal", "dir": str(tmp_path), "mode": "offline", "config": {"a": 1}})
    assert wb.calls[1][2] == 3 and wb.calls[1][1]["train/loss"] == 5.43214 and wb.calls[-1] == ("finish",)


def test_writers_refuse_a_missing_package_in_one_line():
    def missing(name):
        raise ImportError(f"No module named {name!r}")

    with pytest.raises(TidalError, match=r"^\[train\] tensorboard needs the tensorboard package .*pip install") as e:
        writers.check(TrainSection(tensorboard="runs"), importer=missing)
    assert "\n" not in str(e.value)
    with pytest.raises(TidalError, match=r"\[train\] wandb needs the wandb package"):
        writers.check(TrainSection(wandb="offline"), importer=missing)
    with pytest.raises(TidalError, match="wandb must be"):
        writers.check(TrainSection(wandb="online"), importer=missing)
    writers.check(TrainSection(), importer=missing)  # nothing asked, nothing imported


def test_console_never_cuts_when_not_a_terminal():
    from tidal.cli.simulate import sim_tables
    from tidal.simulator.runs import SystemRun

    buf = io.StringIO()
    con = render.console(file=buf, env={})
    assert con.width == render.LOG_WIDTH
    assert render.console(file=io.StringIO(), env={"COLUMNS": "80"}).width == 80
    runs = []
    for name in ("megatron-paper", "deepspeed-paper", "tidal"):
        r = SystemRun(name, "c")
        r.strategies = ["tp2cp4+2*cp4+2*cp2+44*tp1"] * 3 + ["tp2cp4+cp4+3*cp2+46*tp1"]
        runs.append(r)
    for t in sim_tables(runs, {r.name: 1.0 for r in runs}, "simulate: test", con.width):
        con.print(t)
    lines = buf.getvalue().splitlines()
    for r in runs:  # one line per system, its name and strategies whole
        (line,) = [x for x in lines if x.lstrip().startswith(r.name + " ")]
        assert "tp2cp4+2*cp4+2*cp2+44*tp1 x3" in line and "…" not in line


def test_launch_check_under_torchrun():
    a16 = get_cluster("a800x16")
    check_launch({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1", "RANK": "9"}, a16)
    check_launch({}, a16)  # not under torchrun: nothing to check
    with pytest.raises(TidalError, match=r"^torchrun runs 4 ranks on node 0 \(LOCAL_WORLD_SIZE\) but cluster "
                                         r"a800x16 puts 8 devices there .*launch with --nnodes 2 "
                                         r"--nproc-per-node 8$"):
        check_launch({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "0"}, a16)
    with pytest.raises(TidalError, match=r"^torchrun started 8 ranks \(WORLD_SIZE\) but cluster a800x16 has 16 "
                                         r"devices \(2 nodes of 8\): launch with --nnodes 2 --nproc-per-node 8, "
                                         r"or set \[world\] cluster = \"a800x8\"$"):
        check_launch({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}, a16)
    # a partial last node (a800x12: 8 + 4) and a mixed cluster
    a12 = get_cluster("a800x12")
    check_launch({"WORLD_SIZE": "12", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}, a12)
    assert torchrun_shape(a12) == "--nnodes 2 with --nproc-per-node 8 4 on nodes 0..1"
    with pytest.raises(TidalError, match="on node 1 .* puts 4 devices there"):
        check_launch({"WORLD_SIZE": "12", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1"}, a12)
    mixed = get_cluster("h800x8+h20x8")
    with pytest.raises(TidalError, match=r"or set \[world\] cluster = \"TYPEx4\""):
        check_launch({"WORLD_SIZE": "4"}, mixed)
    # CPU: the world size only (cpu's 8 per node is nominal)
    check_launch({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "16", "GROUP_RANK": "0"}, get_cluster("cpux16"))
    with pytest.raises(TidalError, match="cpux4"):
        check_launch({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}, get_cluster("cpux2"))
    with pytest.raises(TidalError, match="LOCAL_WORLD_SIZE='x' is not an integer"):
        check_launch({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "x"}, a16)
