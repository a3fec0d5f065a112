"""Reading a cost model file: a fitted model (JSON), a Hydraulis strategy pool (JSON) or a profile CSV fitted on the
fly. Apart from fitted.py and pool.py because it needs both (pool.py builds on fitted.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType

from tidal.core.cluster import ClusterSpec
from tidal.core.errors import TidalError
from tidal.core.model import ModelSpec
from tidal.costmodel.analytic import AnalyticCostModel
from tidal.costmodel.fitted import MODEL_FORMAT, FittedCostModel, fits_from_json, fitted_from_rows, read_profile
from tidal.costmodel.memory import MemoryConfig
from tidal.costmodel.pool import is_pool, parse_pool, pool_cost_model


def load_cost_model(path: str | Path, model: ModelSpec, cluster: ClusterSpec, *,
                    memory: MemoryConfig | None = None) -> FittedCostModel:
    """Read a fitted model file (JSON), a Hydraulis strategy pool (JSON, `costmodel.pool`: a PoolCostModel) or fit
    a profile CSV on the fly. `memory`: the memory model of a fit's analytic fallback (the MaxLen of schemes with no
    measured one, e.g. the training job's dtypes); default `MemoryConfig()`. A pool has its own memory regression."""
    p = Path(path)
    if p.suffix.lower() == ".csv":
        return fitted_from_rows(read_profile(p), model, cluster, memory=memory)
    try:
        d = json.loads(p.read_text())
    except OSError as e:
        raise TidalError(f"cannot read cost model {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise TidalError(f"cost model {path} is not a UTF-8 JSON file") from None
    except json.JSONDecodeError as e:
        raise TidalError(f"malformed cost model {path}: {e}") from None
    if is_pool(d):
        return pool_cost_model(parse_pool(d, p.name), model, cluster)
    if not isinstance(d, dict) or d.get("format") != MODEL_FORMAT:
        raise TidalError(f"{path}: not a Tidal cost model (format must be {MODEL_FORMAT!r})")
    fits = fits_from_json(d.get("schemes"), f"cost model {path}")
    if d.get("model") not in (None, model.name):
        raise TidalError(f"{path}: fitted for model {d.get('model')!r}, not {model.name!r}")
    fallback = AnalyticCostModel(model, cluster) if memory is None else AnalyticCostModel(model, cluster, memory=memory)
    return FittedCostModel(model, cluster, MappingProxyType(fits), fallback)
