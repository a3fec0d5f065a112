"""Deterministic, shardable initialisation: any slice of any parameter, computed without the rest of the model.

Every weight matrix is N(0, std) drawn in blocks of `BLOCK` rows; block b of parameter i (its position in
`core.model.param_table`) comes from a generator seeded with (seed, i, b) alone. A rank that holds rows [r0, r1) of
a column-parallel shard draws only the blocks covering them; a row-parallel shard draws its rows' blocks in full and
keeps its columns. So a pipeline stage's TP shard initialised on its own equals the same slice of the unsharded model
initialised by `Llama(spec)` with the same seed, and no rank ever materialises the whole model. RMSNorm weights are
ones. Cost: one Gaussian per element of the rows drawn.
"""

from __future__ import annotations

import torch

from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec, ParamInfo, param_table

BLOCK = 256
INIT_STD = 0.02
_SEED_MIX = 1_000_003  # (seed, parameter, block) -> one generator seed below 2**63
_SEED_MOD = 2**63 - 25  # a prime


def init_slice(info: ParamInfo, index: int, seed: int, rows: tuple[int, int] | None = None,
               cols: tuple[int, int] | None = None, *, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu", std: float = INIT_STD) -> torch.Tensor:
    """Rows [r0, r1) and columns [c0, c1) (default: all) of parameter `info`, the `index`-th of the table."""
    n_rows = info.shape[0]
    r0, r1 = rows if rows is not None else (0, n_rows)
    if not 0 <= r0 <= r1 <= n_rows:
        raise TidalError(f"{info.name}: rows {r0}:{r1} out of range for {n_rows}")
    if len(info.shape) == 1:  # RMSNorm weight
        if cols is not None:
            raise TidalError(f"{info.name} is 1-D; it has no columns")
        return torch.ones(r1 - r0, dtype=dtype, device=device)
    n_cols = info.shape[1]
    c0, c1 = cols if cols is not None else (0, n_cols)
    if not 0 <= c0 <= c1 <= n_cols:
        raise TidalError(f"{info.name}: columns {c0}:{c1} out of range for {n_cols}")
    out = torch.empty((r1 - r0, c1 - c0), dtype=dtype, device=device)
    g = torch.Generator()
    b = r0 // BLOCK
    while b * BLOCK < r1:
        lo, hi = b * BLOCK, min((b + 1) * BLOCK, n_rows)
        g.manual_seed(((seed * _SEED_MIX + index) * _SEED_MIX + b) % _SEED_MOD)
        block = torch.randn((hi - lo, n_cols), generator=g, device="cpu") * std  # the generator is the CPU's
        a, z = max(lo, r0), min(hi, r1)
        out[a - r0 : z - r0] = block[a - lo : z - lo, c0:c1].to(device=out.device, dtype=dtype)
        b += 1
    return out


def init_full(spec: ModelSpec, name: str, seed: int, **kw) -> torch.Tensor:
    """The whole parameter `name` as the unsharded model initialises it."""
    for i, info in enumerate(param_table(spec)):
        if info.name == name:
            return init_slice(info, i, seed, **kw)
    raise TidalError(f"model {spec.name} has no parameter {name!r}")


def derive_seed(seed: int) -> int:
    """The initialisation seed `torch.manual_seed(seed); Llama(spec)` uses (its first draw of torch's generator)."""
    g = torch.Generator().manual_seed(int(seed))
    return int(torch.randint(0, 2**31 - 1, (1,), generator=g, device="cpu").item())
