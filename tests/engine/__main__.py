import sys

from tests.engine import main

sys.exit(main())
