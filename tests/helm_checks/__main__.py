"""`.venv/bin/python -m tests.helm_checks` prints the chart's problems."""

import sys

from tests.helm_checks.everything import chart_problems
from tests.helm_checks.helm import helm_binary

found = chart_problems(helm_binary())
for problem in found:
    print(problem)
print(f"{len(found)} problem(s)")
sys.exit(1 if found else 0)
