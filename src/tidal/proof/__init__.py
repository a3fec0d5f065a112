"""Bounds proven after planning, opt-in (decision 114): the mode-aware bound (`modes`, decisions 57, 102; planning
used it until decision 154), LP-priced mode certificates (`lp.prove_selection`, decision 61), the MILP over
whole-document dispatches (`milp`, decision 108) and its pooled relaxation for steps of hundreds of documents (`pool`,
decision 118). A layer above the planner: it raises a selection's reported lower bound and never changes a plan; no
planner module imports it (tests/unit/test_layering.py). `tidal plan --prove-bound` and the grid benchmarks'
`--prove` run it.
"""
