"""`python -m rlvla3.collect`: scripted-expert demonstrations as shards (the code is rlvla3/tools/collect.py)."""
import sys

from rlvla3.tools.collect import main

if __name__ == "__main__":
    sys.exit(main())
