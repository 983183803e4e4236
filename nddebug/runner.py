"""Runs a user's script in a child process of `nddebug run` (``python -m nddebug.runner``).

The script's own ``nddebug.trace()`` blocks save into the file named by NDDEBUG_RECORD; with
NDDEBUG_TRACE_ALL the whole script runs inside one trace block; with NDDEBUG_SEED every
seed (Python, NumPy, TensorFlow, Keras) is set first.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    # As `python script.py` runs it: __file__ absolute (Python 3.9+), so a script that
    # changes directory still finds the files beside it (probe round 48, F7).
    script = os.path.abspath(script)
    sys.path.insert(0, os.path.dirname(script))
    if os.environ.get("NDDEBUG_SEED"):
        # report.verify() checks the seeding fix this way: every seed set before the script.
        from nddebug.state import set_seeds

        set_seeds(int(os.environ["NDDEBUG_SEED"]))
    if os.environ.get("NDDEBUG_TRACE_ALL"):
        from nddebug.tracer import trace

        with trace():
            runpy.run_path(script, run_name="__main__")
    else:
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
