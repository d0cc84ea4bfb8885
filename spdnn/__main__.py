import sys

from spdnn.cli.entry import main

sys.exit(main())
