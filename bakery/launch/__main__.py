"""``python -m bakery.launch start|stop|status ...``: the launcher's group (run.sh calls the
same ``bakery.cli.launch.main``)."""

import sys

from bakery.cli.launch import main

sys.exit(main())
