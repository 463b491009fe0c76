"""`python -m rlvla3.openloop`: what a cloned policy acts on, by swapping its inputs between
demonstration rows (the code is rlvla3/tools/openloop.py)."""
import sys

from rlvla3.tools.openloop import main

if __name__ == "__main__":
    sys.exit(main())
