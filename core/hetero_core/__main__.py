import sys

from hetero_core.cli import main

sys.exit(main())
