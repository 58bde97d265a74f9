"""Follow-up studies the service never runs, which the scripts beside this package import
(`from experiments.selection import ...`, as they import `provenance`): the rule that chose
the shipped follow-up configuration (`selection`, `follow_up_selection.py`), the judge of
condense rewrites (`standalone`, `condense_rewrites.py`) and the reranker's text forms
(`rerank_forms`, `rerank_query.py`). The candidates `chatqna bench` can plan with stay in
`chatqna.evaluation.follow_up_variants`, since the harness's planning and search call them.
"""
