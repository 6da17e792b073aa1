"""`python -m netsleuth` is the same as the `netsleuth` console script."""

import sys

from netsleuth.cli import main

sys.exit(main())
