"""python -m gfxbpf.client: the gfxclient command."""

import sys

from gfxbpf.client.cli import main

sys.exit(main())
