"""`python -m workers.loadgen …` (the CLI), and the child side of a level driven over several
processes (`--shard`)."""

import asyncio
import sys

from workers.loadgen.cli import main
from workers.loadgen.drivers import shard_main

if sys.argv[1:] == ["--shard"]:
    asyncio.run(shard_main())
else:
    sys.exit(main())
