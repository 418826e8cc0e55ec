"""`python -m orchestration.cli`."""

import sys

from orchestration.cli import main

sys.exit(main())
