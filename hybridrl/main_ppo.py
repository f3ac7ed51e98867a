"""`python -m hybridrl.main_ppo key=value ...`:
verl's `python3 -m verl.trainer.main_ppo` command line, run by hybridrl (docs/verl.md).
"""

import sys

from hybridrl.cli.verl import main

if __name__ == "__main__":
    sys.exit(main("ppo"))
