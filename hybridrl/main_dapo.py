"""`python -m hybridrl.main_dapo key=value ...`:
verl's `python3 -m recipe.dapo.main_dapo` command line, run by hybridrl (docs/verl.md).
"""

import sys

from hybridrl.cli.verl import main

if __name__ == "__main__":
    sys.exit(main("dapo"))
