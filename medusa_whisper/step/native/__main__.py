"""``python -m medusa_whisper.step.native``: build the row kernels (``make setup`` runs it)."""

import sys

from . import main

sys.exit(main())
