"""`python -m rlvla3.plan`: the planner: show, ladder, profile, validate (the code is rlvla3/planner/cli.py)."""
import sys

from rlvla3.planner.cli import main

if __name__ == "__main__":
    sys.exit(main())
