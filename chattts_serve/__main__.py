"""``python -m chattts_serve``: the same as the ``chattts-serve`` command."""

import sys

from .cli import main

sys.exit(main())
