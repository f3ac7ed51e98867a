"""`python -m hybridrl`."""

import sys

from hybridrl.cli.main import main

sys.exit(main())
