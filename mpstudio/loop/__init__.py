"""The study's loop, one room per idea: a plan is generated, run, scored, estimated and recorded
(`evaluation`), previewed before that (`prediction`, `streaming`), placed on the front (`front`, `summary`),
and queued so that a killed process resumes it (`jobs`).

The rest of a study's folder has a room each: its files (`folder`), the float model's outputs (`reference`),
the sensitivity reports (`sensitivity_cache`), the cost model and its recalibration on device profiles
(`cost_model`, `recalibration`). Where plans run: `runners` (this process or agents) and `inprocess` (a model
over a data source in this process, with its worker pool). `mpstudio.study.Study` is the face that wires them.

Import names from their room (`from mpstudio.loop.front import pareto_mask`): this package imports nothing
itself, so a spawned worker that needs `inprocess` loads no more than that.
"""
