"""A training script with a real CPU culprit (CropAndResizeGradImage); two steps are traced."""

import sys

import nddebug
from nddebug.examples.detection import make_step

# Steps per trace block (default 2). The kernel races only when both threads run at once, so
# a test that needs one recording to show the race on a loaded machine asks for more steps.
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2
step, args, _ = make_step()
with nddebug.trace():
    for _ in range(steps):
        step(*args)
