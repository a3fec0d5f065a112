"""`tidal profile`: measure the real runtime's forward + backward per scheme on this machine and fit the cost model.

    tidal profile --model tiny --cluster cpux4 --schemes auto --out profile.json

Writes `profile.json` (the fitted model: a, b, c and MaxLen per scheme; `--cost-model profile.json` for `tidal
plan | simulate | train`), `profile.csv` beside it (the measured rows, profile format of docs/costmodel.md) and
`profile.png` (measured points against the fitted curves). Details: docs/costmodel.md, runtime/profiler.py.
"""

from __future__ import annotations

from pathlib import Path

from tidal.cli import args as argtypes
from tidal.core.errors import TidalError


def add_parser(sub) -> None:
    p = sub.add_parser("profile", help="profile forward+backward per scheme on this machine; fit latency and MaxLen",
                       description=__doc__)
    p.add_argument("--model", default="tiny", help="model preset, or a TOML file whose [model] section gives a shape")
    p.add_argument("--cluster", default="cpux4", help="TYPExN, as for `tidal plan`: its N ranks are spawned here")
    p.add_argument("--schemes", default="auto",
                   help="'auto' (every <TP,PP,CP> of powers of two fitting N, at most two degrees > 1) or a list, "
                        "e.g. 'tp1,tp2,cp2,tp2pp2'")
    p.add_argument("--out", type=Path, default=Path("profile.json"), help="fitted model JSON (CSV and PNG beside it)")
    p.add_argument("--totals", default="256,512,1024,2048", help="tokens per profiled micro-batch")
    p.add_argument("--mixes", default="8,32", help="sizes of the long-tailed document mixes per total")
    p.add_argument("--data", default=None,
                   help="draw the profiled micro-batches from this corpus's documents (a [data] source: stdlib, "
                        "jsonl:PATH[:field], ...) instead of synthetic mixes, so the fit sees training's mix")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json for --data (UTF-8 bytes when omitted)")
    p.add_argument("--draws", type=int, default=6, help="with --data: micro-batches drawn per total length")
    p.add_argument("--max-doc", type=int, default=None,
                   help="split profiled documents longer than this (use the training's max_len)")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per micro-batch (median)")
    p.add_argument("--memory-gib", type=float, default=None,
                   help="per-device memory for MaxLen (default: CUDA's total memory, else the cluster's device type)")
    p.add_argument("--attn-backend", default="auto", help="attention kernel: auto, mixed, flash, flex, sdpa, reference")
    p.add_argument("--compile", default="auto",
                   help="[model] compile: auto (as training: RMSNorm and SwiGLU's gate compiled on CUDA), off or dense")
    p.add_argument("--dtype", default="auto",
                   help="compute dtype profiled: auto (training's default: bfloat16 on CUDA, float32 on CPU), "
                        "float32, bfloat16 or float64")
    p.add_argument("--seed", type=argtypes.seed, default=0, help="seed of the profiled micro-batches")
    p.add_argument("--timeout", type=argtypes.positive_seconds, default=900.0,
                   help="seconds per scheme before a hung rank fails")
    p.set_defaults(func=run)


def _ints(text: str, what: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TidalError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not out or min(out) < 1:
        raise TidalError(f"{what} must be positive integers, got {text!r}")
    return out


def run(args) -> int:
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tidal.cli import render
    from tidal.core.cluster import get_cluster
    from tidal.core.scheme import parse_scheme
    from tidal.models.attention import BACKENDS
    from tidal.models.dense import COMPILE_MODES
    from tidal.runtime.config import model_arg
    from tidal.runtime.profile import compositions, write_rows
    from tidal.runtime.profiler import auto_schemes, profile_dtype, profile_model, result_extra

    spec, cluster = model_arg(args.model).spec(), get_cluster(args.cluster)
    if args.attn_backend not in BACKENDS:
        raise TidalError(f"unknown attention backend {args.attn_backend!r}; choose one of {', '.join(BACKENDS)}")
    if args.compile not in COMPILE_MODES:
        raise TidalError(f"--compile must be one of {', '.join(COMPILE_MODES)}, got {args.compile!r}")
    if args.repeats < 1:
        raise TidalError(f"--repeats must be >= 1, got {args.repeats}")
    totals = _ints(args.totals, "--totals")
    if args.max_doc is not None and args.max_doc < 1:
        raise TidalError(f"--max-doc must be >= 1, got {args.max_doc}")
    if args.data:
        from tidal.cli.tokenizer import user_cache_dir
        from tidal.data.corpus import corpus_from_spec
        from tidal.runtime.profile import corpus_compositions

        src = corpus_from_spec(args.data, seed=args.seed, vocab=spec.vocab, tokenizer=args.tokenizer,
                               cache_dir=user_cache_dir()).length_source()
        n = 20000 if src.size is None else min(src.size, 20000)
        if args.draws < 1:
            raise TidalError(f"--draws must be >= 1, got {args.draws}")
        mbs = corpus_compositions(src.lengths(0, n), totals, args.draws, args.seed, args.max_doc)
    else:
        mbs = compositions(totals, args.seed, _ints(args.mixes, "--mixes"), args.max_doc)
    if args.schemes.strip().lower() == "auto":
        schemes = auto_schemes(spec, cluster.num_devices)
    else:
        schemes = tuple(parse_scheme(s) for s in args.schemes.replace("+", ",").split(",") if s.strip())
    if not schemes:
        raise TidalError(f"no scheme in --schemes {args.schemes!r}")
    if not args.out.parent.is_dir():
        raise TidalError(f"--out {args.out}: directory {args.out.parent} does not exist")
    dist_backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= cluster.num_devices \
        else "gloo"
    dtype = profile_dtype(args.dtype, dist_backend)  # a bad --dtype fails before any rank starts
    console = render.console()
    console.print(f"profiling in {dtype} on {'CUDA' if dist_backend == 'nccl' else 'CPU'}")
    bar = Progress(TextColumn("profiling"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                   TimeElapsedColumn(), console=console)
    with bar:
        task = bar.add_task("profile", total=len(schemes), info=f"{schemes[0].short()} ...")

        done = [0]

        def on_scheme(p) -> None:
            done[0] += 1
            nxt = schemes[done[0]].short() if done[0] < len(schemes) else "fitting"
            console.print(f"{p.scheme.short():>8}: {len(p.points)} micro-batches x {p.replicas} replica(s), "
                          f"{p.wall_s:.1f} s wall")
            bar.update(task, advance=1, info=f"{nxt} ...")

        res = profile_model(spec, cluster, schemes, mbs, memory_gib=args.memory_gib, repeats=args.repeats,
                            attn_backend=args.attn_backend, seed=args.seed, dist_backend=dist_backend,
                            timeout_s=args.timeout, on_scheme=on_scheme, dtype=dtype, compile=args.compile)
    device = cluster.device_type(0).name
    try:
        args.out.write_text(res.model.to_json(device, result_extra(res, totals)) + "\n")
        csv_path, png_path = args.out.with_suffix(".csv"), args.out.with_suffix(".png")
        write_rows(csv_path, spec, device, res.rows())
    except OSError as e:
        raise TidalError(f"cannot write {e.filename}: {e.strerror}") from None
    plot_profile(res, png_path)
    render.profile_table(console, res)
    console.print(f"fitted model: {args.out} (use --cost-model {args.out}); rows: {csv_path}; plot: {png_path}")
    return 0


def plot_profile(res, path: Path) -> None:
    """Measured seconds against the fitted T per scheme, one panel per scheme, x = tokens of the micro-batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    n = len(res.schemes)
    cols = min(4, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), squeeze=False)
    dev = res.model.cluster.device_type(0)
    for ax, sp in zip(axes.flat, res.schemes):
        co = res.model.coeffs(sp.scheme, dev)
        docs = sorted({len(p.lengths) for p in sp.points})
        colors = plt.cm.viridis(np.linspace(0, 0.9, len(docs)))
        for d, col in zip(docs, colors):
            pts = sorted((sum(p.lengths), p.seconds, co.mb_time(p.lengths)) for p in sp.points if len(p.lengths) == d)
            x = [q[0] for q in pts]
            ax.scatter(x, [q[1] * 1e3 for q in pts], color=col, s=14, label=f"{d} doc(s)")
            ax.plot(x, [q[2] * 1e3 for q in pts], color=col, lw=1)
        fit = res.model.fits[str(sp.scheme)]
        ax.set_title(f"{sp.scheme.short()}  rel. RMSE {fit.rel_rmse:.1%}", fontsize=9)
        ax.set_xlabel("tokens per micro-batch", fontsize=8)
        ax.set_ylabel("fwd+bwd ms (points: measured, lines: fit)", fontsize=7)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    from tidal.cli.render import save_figure

    save_figure(fig, path)
