"""The first-minute demo: check a real training step that has a real CPU culprit.

Run ``python -m nddebug.demo``. The step crops 4096 overlapping boxes from a feature map
(a detection head); TensorFlow's CPU ``CropAndResizeGradImage`` kernel races on them.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import nddebug
    from nddebug.examples.detection import make_step

    step, args, state = make_step()
    print("Checking a detection-style training step: 5 repeats with identical inputs and state…")
    report = nddebug.check(step, *args, repeats=5, state=state)
    print()
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
