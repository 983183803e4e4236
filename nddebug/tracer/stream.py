"""A long run traced into a file as it goes (``trace(path=...)``): memory bounded by a chunk.

A block given a path keeps its op executions in memory as any block does until they reach a
chunk (:data:`nddebug.storage.CHUNK_EVENTS`). From then on, each time a top-level call ends
(or an eager op runs outside a call) with a chunk's worth held, they are appended to the
file as one chunk (:class:`nddebug.storage.RunWriter`) and dropped from memory; the block's
end appends the rest and closes the run. A process that dies meanwhile leaves the chunks so
far, readable as an interrupted run. The block's Recording then holds no events
(``streamed_to`` says where they are; ``Recording.whole()`` reads them back). A short block
never streams: it is saved when it ends, as before.

If the file cannot be written when a chunk is due, nothing is lost: the block goes on in
memory and its end writes the rest (or reports why it cannot) as a short block's save does.
"""

from __future__ import annotations

import os
from typing import Any

from nddebug.recording import Event, Recording


class EventStream:
    """Where a traced block's events go once they exceed a chunk."""

    def __init__(self, path: str, recording: Recording, chunk: int | None = None) -> None:
        from nddebug import storage

        self.path = path
        self.recording = recording
        self.chunk = chunk or storage.CHUNK_EVENTS
        self.writer: Any = None  # storage.RunWriter once the first chunk is written
        self.failed = False  # the file could not be written: the block stays in memory
        self.pid = os.getpid()  # a child forked inside the block writes nothing

    def due(self, held: int) -> bool:
        """Whether ``held`` events in memory are to be written now."""
        return not self.failed and held >= self.chunk and os.getpid() == self.pid

    def write(self, events: list[Event]) -> bool:
        """Append ``events`` (complete steps, in seq order) as chunks; False if the file
        could not be written (the caller keeps them)."""
        from nddebug import storage

        try:
            if self.writer is None:
                header = _header(self.recording)
                self.writer = storage.RunWriter(self.path, header, chunk_events=self.chunk)
            self.writer.append(events, self.recording.ops)
        except (OSError, storage.RecordingFileError):
            # Kept in memory from here on; the block's end writes them (or says why not).
            self.failed = True
            return False
        return True

    @property
    def started(self) -> bool:
        return self.writer is not None

    def finish(self) -> None:
        """Append what is left, close the run with its final status, warnings, environment,
        ops and captured values, and empty the Recording (see :meth:`Recording.whole`)."""
        rec = self.recording
        try:
            self.writer.append(sorted(rec.events, key=lambda e: e.seq), rec.ops)
            self.writer.close(
                rec.status,
                warnings=list(rec.warnings),
                environment=rec.environment,
                values=rec.values,
                ops=rec.ops,
            )
        except BaseException:
            # The file keeps the chunks written so far, as an interrupted run; this Recording
            # keeps the rest. Neither is the whole run, and both say so.
            rec.status = "interrupted"
            rec.warnings.append(
                f"The run could not be completed in {self.path}: its first "
                f"{self.writer.events_written} op executions are there (an interrupted run) "
                f"and only the last {len(rec.events)} are in this Recording."
            )
            raise
        rec.events = []
        rec.values = {}
        rec.streamed_to = self.path


def _header(rec: Recording) -> Recording:
    """The run as the file first holds it: its metadata, no events yet."""
    import dataclasses

    return dataclasses.replace(rec, ops={}, events=[], values={})
