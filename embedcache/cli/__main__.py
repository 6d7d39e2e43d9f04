"""``python -m embedcache.cli``: the same as the ``embedcache`` command."""

from __future__ import annotations

import sys

from embedcache.cli import main

sys.exit(main())
