"""`.venv/bin/python -m tests.deploy_checks` prints the repository's problems."""

import sys

from tests.deploy_checks.everything import repository_problems

found = repository_problems()
for problem in found:
    print(problem)
print(f"{len(found)} problem(s)")
sys.exit(1 if found else 0)
