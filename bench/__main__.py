"""`python -m bench`: the benchmark runner (see bench/runner.py)."""

import sys

from bench.runner import main

sys.exit(main())
