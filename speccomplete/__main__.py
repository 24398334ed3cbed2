import sys

from speccomplete.cli import main

sys.exit(main())
