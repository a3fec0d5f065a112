"""Plans built at random for the planner passes' tests (tests/ is on sys.path: its conftest.py is the rootdir's)."""


def random_plan(rng, l_, pipes, skip=lambda j: False):
    """Each document on a random pipeline that holds it (never one `skip(j)` names, so those stay empty), first fit
    into that pipeline's micro-batches: bins[j] lists pipeline j's micro-batches as lists of document indices."""
    bins = [[] for _ in pipes]
    for i, x in enumerate(l_.tolist()):
        j = int(rng.choice([j for j, p in enumerate(pipes) if x <= p.max_len and not skip(j)]))
        b = next((b for b in bins[j] if int(l_[b].sum()) + x <= pipes[j].max_len), None)
        if b is None:
            bins[j].append([i])
        else:
            b.append(i)
    return bins
