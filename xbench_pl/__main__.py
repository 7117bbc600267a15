import sys

from xbench_pl.commands import main

sys.exit(main())
