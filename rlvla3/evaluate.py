"""`python -m rlvla3.evaluate`: held-out evaluation of a checkpoint (the code is rlvla3/tools/evaluate.py)."""
import sys

from rlvla3.tools.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
