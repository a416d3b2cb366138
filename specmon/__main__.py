"""`python -m specmon`: the command line."""
import sys

from specmon.cli.main import main

sys.exit(main())
