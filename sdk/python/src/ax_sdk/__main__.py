"""`python -m ax_sdk`: the Python worker's command line (also installed as `ax-python-worker`)."""

import sys

from ax_sdk.worker import main

sys.exit(main())
