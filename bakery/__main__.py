import sys

from bakery.cli.root import main

sys.exit(main())
