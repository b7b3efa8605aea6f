#!/usr/bin/env python
"""Build an SJD-PV phrase library from a model's own image tokenizer: the same program as ``hf-sjd build-phrases``
(``hf_sjd/phrase_builder.py``; run with ``--help`` for its documentation).

    python scripts/build_phrase_library.py --model BAAI/Emu3-Gen-hf --dataset detection-datasets/coco \\
        --streaming --max-images 10000 --out emu3-coco-phrases
    # the shipped reference library: 4000 of the reference AR model's training images
    python scripts/build_phrase_library.py --dataset reference --max-images 4000 --out phrases

Exit status: 0 on success, 2 for bad input (a clear message, nothing written), 1 when only ``--push-to-hub``
failed (the local library is saved).
"""

from __future__ import annotations

import sys

from hf_sjd import phrase_builder

PROG = "python scripts/build_phrase_library.py"


def main(argv: list[str] | None = None) -> int:
    return phrase_builder.main(argv, prog=PROG)


if __name__ == "__main__":
    sys.exit(main())
