import sys
from pathlib import Path

# --import-mode=importlib keeps test folders off sys.path; the TP tests' worker processes import
# their entry point (tp_workers.py) from here by name.
sys.path.insert(0, str(Path(__file__).parent))
