"""Errors nddebug raises on bad input; each message says what was wrong and what to do."""


class NddebugError(Exception):
    """Base class for every error nddebug raises on purpose."""


class RecordingFileError(NddebugError):
    """A recording file is missing, corrupt, truncated, or of an unknown format or version."""


class EmptyTraceError(NddebugError):
    """A trace recorded no TensorFlow op, so there is nothing to compare."""


class NotComparableError(NddebugError):
    """Recordings cannot be compared (fewer than two, or different digest algorithms)."""


class TraceError(NddebugError):
    """A trace cannot start, e.g. inside another trace."""


class CensusError(NddebugError, ValueError):
    """Bad census arguments (unknown op type, device, repeats), or no worker could start."""
