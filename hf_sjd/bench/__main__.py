"""``python -m hf_sjd.bench`` (and ``accelerate launch -m hf_sjd.bench``): the same flags as ``hf-sjd bench``."""

import sys

from .driver import main

sys.exit(main())
