"""`python -m rlvla3.recipe`: demos, SFT, RL and evaluation in one command (the code is rlvla3/tools/recipe.py)."""
import sys

from rlvla3.tools.recipe import main

if __name__ == "__main__":
    sys.exit(main())
