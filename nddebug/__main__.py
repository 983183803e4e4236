"""``python -m nddebug`` is the ``nddebug`` command."""

import sys

from nddebug.cli import main

sys.exit(main())
