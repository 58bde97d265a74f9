"""The multi-turn retrieval benchmark: datasets, metrics, modes, runner and reports."""
