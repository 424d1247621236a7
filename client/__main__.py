"""python -m gfxbpf.client: the gfxclient command."""

import sys

from gfxbpf.client.cli.gfxclient import main

sys.exit(main())
