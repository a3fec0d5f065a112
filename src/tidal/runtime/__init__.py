"""torch.distributed execution. Process groups are always passed explicitly; nothing here is a global singleton."""
