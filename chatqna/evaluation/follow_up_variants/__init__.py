"""Mechanisms measured around the shipped follow-up configuration, which the service never
runs: the candidates it was chosen among (`candidates`, `hedge`). The harness plans and
searches with them (`chatqna.evaluation.modes`, `chatqna.evaluation.live`) so that the
measured grids can be re-run (`benchmarks/follow_up_selection.py`); the rule that chose the
shipped configuration and the other studies are in `benchmarks/experiments/`.
"""
