"""``python -m bakery.launch start|stop|status ...``: what launcher/dcp2/run.sh execs."""

import sys

from bakery.launch.cli import main

sys.exit(main())
