"""The systems Tidal is compared with, as planners (decision 106): WLB-LLM's packing and outlier-delay queues
(`wlb`), FlexPipe's HBSA (`flexpipe`) and its per-step planner for `tidal train` (`flexpipe_steps`), token-count
first-fit-decreasing packing (`fixed`), and every packing a StepPlanner runs, by name (`packings.PACKINGS`).

A layer of its own above the planner: it builds on the planner's parts (bounds.PipeCost, packing.PackResult, the
compiled loops, the stepper), and the simulator, runtime, CLI and library (`tidal.api`) hand its packings to the
StepPlanner. The planner never imports it (tests/unit/test_layering.py). Hydraulis' Alg. 1 dispatch is a planner
part (planner/alg1.py): select.assign runs it on every step.
"""
