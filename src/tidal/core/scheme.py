"""ParallelScheme <TP, PP, CP> of one pipeline and the strategy string syntax (`tp4+tp2pp2+2*tp1pp2;tp8`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec


@dataclass(frozen=True, order=True)
class ParallelScheme:
    tp: int = 1
    pp: int = 1
    cp: int = 1
    # Layers per pipeline stage; None means as even as possible (earlier stages take the remainder).
    layer_split: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "cp"):
            if getattr(self, f) < 1:
                raise TidalError(f"scheme {self}: {f} must be >= 1")
        if self.layer_split is not None and len(self.layer_split) != self.pp:
            raise TidalError(f"scheme {self}: layer_split has {len(self.layer_split)} stages, pp is {self.pp}")

    @property
    def num_devices(self) -> int:
        return self.tp * self.pp * self.cp

    def validate(self, model: ModelSpec) -> None:
        if model.heads % self.tp or model.kv_heads % self.tp:
            raise TidalError(
                f"TP={self.tp} does not divide heads={model.heads} and kv_heads={model.kv_heads} of {model.name}"
            )
        if self.pp > model.layers:
            raise TidalError(f"PP={self.pp} exceeds the {model.layers} layers of {model.name}")
        if self.layer_split is not None and (sum(self.layer_split) != model.layers or min(self.layer_split) < 1):
            raise TidalError(f"layer_split {self.layer_split} must be positive and sum to {model.layers} layers")

    def stage_layers(self, layers: int) -> tuple[int, ...]:
        if self.layer_split is not None:
            return self.layer_split
        q, r = divmod(layers, self.pp)
        return tuple(q + (1 if s < r else 0) for s in range(self.pp))

    def __str__(self) -> str:
        s = f"tp{self.tp}pp{self.pp}cp{self.cp}"
        if self.layer_split is not None:
            s += "[" + ",".join(map(str, self.layer_split)) + "]"
        return s

    def short(self) -> str:
        """The shortest string that parses back to this scheme (degrees of 1 omitted)."""
        parts = [f"{k}{v}" for k, v in (("tp", self.tp), ("pp", self.pp), ("cp", self.cp)) if v != 1]
        s = "".join(parts) or "tp1"
        if self.layer_split is not None:
            s += "[" + ",".join(map(str, self.layer_split)) + "]"
        return s


_SCHEME = re.compile(r"^(?:(tp|pp|cp)(\d+))*(?:\[([\d,\s]+)\])?$")
_DEGREE = re.compile(r"(tp|pp|cp)(\d+)")


def parse_scheme(text: str) -> ParallelScheme:
    t = text.strip().lower()
    m = _SCHEME.match(t)
    if not t or not m:
        raise TidalError(f"bad scheme {text!r}: expected e.g. tp2pp2cp1, tp4, pp4[10,6,6,10]")
    body = t.split("[", 1)[0]
    seen: dict[str, int] = {}
    for k, v in _DEGREE.findall(body):
        if k in seen:
            raise TidalError(f"bad scheme {text!r}: {k} given twice")
        seen[k] = int(v)
    if not seen:
        raise TidalError(f"bad scheme {text!r}: give at least one of tp, pp, cp")
    split = tuple(int(x) for x in m.group(3).split(",")) if m.group(3) else None
    return ParallelScheme(seen.get("tp", 1), seen.get("pp", 1), seen.get("cp", 1), split)


def parse_strategy(text: str) -> tuple[ParallelScheme, ...]:
    """`tp4+tp2pp2+2*tp1pp2` -> one scheme per pipeline, multipliers expanded, order kept."""
    out: list[ParallelScheme] = []
    for term in text.split("+"):
        term = term.strip()
        mult = 1
        if "*" in term:
            k, term = term.split("*", 1)
            if not k.strip().isdigit() or int(k) < 1:
                raise TidalError(f"bad multiplier in {text!r}: {k!r}")
            mult = int(k)
        out += [parse_scheme(term)] * mult
    return tuple(out)


def parse_strategies(text: str) -> tuple[tuple[ParallelScheme, ...], ...]:
    """Strategies separated by `;`."""
    strategies = tuple(parse_strategy(s) for s in text.split(";") if s.strip())
    if not strategies:
        raise TidalError(f"no strategy in {text!r}")
    return strategies


def format_strategy(schemes: tuple[ParallelScheme, ...]) -> str:
    """Inverse of parse_strategy, grouping consecutive equal schemes as `N*scheme`."""
    parts: list[str] = []
    i = 0
    while i < len(schemes):
        j = i
        while j < len(schemes) and schemes[j] == schemes[i]:
            j += 1
        n = j - i
        parts.append(f"{n}*{schemes[i].short()}" if n > 1 else schemes[i].short())
        i = j
    return "+".join(parts)
