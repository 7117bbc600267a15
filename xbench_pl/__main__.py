import sys

from xbench_pl.cli import main

sys.exit(main())
