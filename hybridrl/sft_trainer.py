"""`python -m hybridrl.sft_trainer key=value ...`:
verl's `torchrun -m verl.trainer.fsdp_sft_trainer` command line, run by hybridrl (docs/verl.md).
"""

import sys

from hybridrl.cli.verl import main

if __name__ == "__main__":
    sys.exit(main("sft"))
