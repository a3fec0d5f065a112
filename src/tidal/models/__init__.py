"""Plain nn.Module models and the varlen attention interface; never imports torch.distributed."""

from tidal.models.attention import BACKENDS, VarlenMeta, resolve_backend, varlen_attention
from tidal.models.llama import Llama, VarlenBatch, loss_sum

__all__ = ["BACKENDS", "Llama", "VarlenBatch", "VarlenMeta", "loss_sum", "resolve_backend", "varlen_attention"]
