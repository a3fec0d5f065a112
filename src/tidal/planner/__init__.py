"""Pure, seeded planning functions: dispatch, packing, bounds, per-step selection, strategy proposal.

Import submodules explicitly (e.g. `from tidal.planner.select import select_step`); this package exports nothing.
"""
