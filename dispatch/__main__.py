"""``python -m dispatch`` is the same as the ``hostrun`` console script."""

import sys

from dispatch.cli import main

sys.exit(main())
