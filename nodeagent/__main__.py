"""``python -m nodeagent ...`` is ``gpupool-agent ...``."""

import sys

from nodeagent.cli import main

sys.exit(main())
