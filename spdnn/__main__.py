import sys

from spdnn.cli.parser import main

sys.exit(main())
