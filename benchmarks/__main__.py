"""``python -m benchmarks SUITE ...`` (also under ``accelerate launch -m benchmarks``) and
``python -m benchmarks loop-cost ...``; ``--help`` lists both."""

import sys

if len(sys.argv) > 1 and sys.argv[1] == "loop-cost":
    from .loop_cost import main

    sys.exit(main(sys.argv[2:]))
from .driver import main

sys.exit(main())
