"""The tiny 4-rank training config the CLI tests start from (one copy; each test file appends or overrides)."""


def tiny_toml(max_len: int = 128, tokens_per_step: int = 512, optimizer: bool = False, train: str = "") -> str:
    """`[model]` tiny on `cpux4` over `stdlib:defs`, strategies `tp2+2*tp1;4*tp1`; with `optimizer`, lr 1e-3 and one
    warm-up step; `train`: the `[train]` section's lines."""
    opt = "[optimizer]\nlr = 1e-3\nwarmup_steps = 1\n" if optimizer else ""
    return (f'[model]\nname = "tiny"\nattn_backend = "sdpa"\n[world]\ncluster = "cpux4"\n'
            f'[data]\nsource = "stdlib:defs"\nmax_len = {max_len}\ntokens_per_step = {tokens_per_step}\n'
            f'[planner]\nstrategies = "tp2+2*tp1;4*tp1"\n{opt}[train]\n{train}')
