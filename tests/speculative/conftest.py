"""Helper modules of this folder (draft_helpers) import by name under any import mode."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
