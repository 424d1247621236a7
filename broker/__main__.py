"""python -m gfxbpf.broker: the same as the gfxbpf-broker command."""

import sys

from gfxbpf.broker.main import main

sys.exit(main())
