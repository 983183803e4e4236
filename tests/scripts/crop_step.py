"""A training script with a real CPU culprit (CropAndResizeGradImage); two steps are traced."""

import nddebug
from nddebug.examples.detection import make_step

step, args, _ = make_step()
with nddebug.trace():
    for _ in range(2):
        step(*args)
