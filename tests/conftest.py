"""Shared test setup: keep TensorFlow's C++ logging quiet (must be set before TF is imported)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
