"""`python -m rlvla3.sft`: supervised warm start on demonstration shards (the code is rlvla3/tools/sft.py)."""
import sys

from rlvla3.tools.sft import main

if __name__ == "__main__":
    sys.exit(main())
