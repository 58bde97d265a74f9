"""Mechanisms and protocols measured around the shipped follow-up configuration, which the
service never runs: the candidates it was chosen among (`candidates`, `hedge`), the rule
that chose it (`selection`, `benchmarks/follow_up_selection.py`) and the judge of condense
rewrites (`standalone`, `benchmarks/condense_rewrites.py`). `chatqna bench` can plan with the
candidates (`chatqna.evaluation.modes`) so that the measured grids can be re-run.
"""
