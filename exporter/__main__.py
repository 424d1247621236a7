"""python -m gfxbpf.exporter: the gfxbpf-exporter command."""

import sys

from gfxbpf.exporter.main import main

sys.exit(main())
