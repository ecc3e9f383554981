"""`python -m queueworker.cli`: the `queueworker` command."""

import sys

from . import main

sys.exit(main())
