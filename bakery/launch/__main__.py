"""``python -m bakery.launch start|stop|status ...``: what launcher/dcp2/run.sh execs."""

import sys

from bakery.cli.launch import main

sys.exit(main())
