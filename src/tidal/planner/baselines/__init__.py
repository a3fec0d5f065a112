"""The systems Tidal is compared with, as planners: Hydraulis' Alg. 1 dispatch (`hydraulis`), WLB-LLM's packing and
outlier-delay queues (`wlb`), FlexPipe's HBSA (`flexpipe`) and token-count first-fit-decreasing packing (`fixed`).

They build on the planner's parts (bounds.PipeCost, packing.PackResult, dispatch.DispatchResult, the compiled loops)
and the planner uses two of them: select.assign packs Hydraulis' dispatch too (never worse than it), and the
stepper offers every packer by name. No baseline imports select, stepper or proposal (tests/unit/test_layering.py).
"""
