"""``python -m spindle doctor``: the same as the ``spindle`` console script."""

from .cli import main

raise SystemExit(main())
