"""The engine's errors, one type per cause.

The serving layer maps each type to an HTTP status and an OpenAI error body in one place
(``serve_app.protocol.to_api_error``); nothing there reads an exception's message to decide.
This module imports nothing heavy: every stage, torch or not, can raise and catch these.
"""

from __future__ import annotations


class EngineError(RuntimeError):
    """A request failed inside the engine (its stream ends with this error)."""


class EngineOverloaded(EngineError):
    """The admission queue is full: try again later."""


class ClientQueueFull(EngineOverloaded):
    """This client already has as many rows waiting as one client may
    (``AcousticConfig.max_queued_rows_per_client``): try again once some have started. Other
    clients' requests, and this client's own queued ones, are not affected."""


class CapacityExhausted(EngineOverloaded):
    """A real-time stream could not start within ``AcousticConfig.capacity_wait_s``: the replica
    decodes as many streams as its measured capacity keeps at 1x (a stream beyond it would make
    every listener stall), and none ended in time. Retry shortly, or another replica."""


class RefineBusy(EngineOverloaded):
    """refine_text could not start within ``AcousticConfig.refine_wait_s``: the refiner is busy
    with other requests' refines; try again later (or without refine_text)."""


class RefineCancelled(EngineError):
    """A refine_text call stopped because its caller went away (nobody reads the result)."""


class RequestTooLarge(EngineError):
    """A request costs more than a limit allows (segments or seconds of speech after
    normalisation, rows in the queue, refine_text input); the message names the limit and the
    figure. Retrying the same request cannot help: send less text (or a higher speed)."""


class VoiceError(ValueError):
    """A voice string that cannot be used."""


class UnknownVoiceError(VoiceError):
    """The voice names no voice (not a built-in name, ``seed:<n>`` or a speaker string)."""


class InvalidVoiceError(VoiceError):
    """The voice looks like a seed or a speaker string but is malformed or out of range."""


class EmptyInputError(ValueError):
    """The text has nothing speakable (only punctuation, tags or whitespace)."""


class InvalidInstructionsError(ValueError):
    """``instructions`` the style reader does not take: longer than ``MAX_INSTRUCTIONS_CHARS``
    (``engine/styles.py``). The API's schemas bound every instructions field the same, so this
    reaches only callers that skip them; a 400 naming the field, never a 500."""


class InvalidClipError(ValueError):
    """A reference clip for a voice cannot be used: undecodable, too short or long, silent."""


class InvalidSSMLError(ValueError):
    """SSML input that cannot be read: not well-formed XML, a DTD or entity declaration, an
    unsupported structure or an attribute value out of range. The message names the element
    and where it is (1-based line and column of the element, or of the XML syntax error);
    ``element``, ``line`` and ``column`` hold the same for callers that want them."""

    def __init__(
        self, message: str, element: str | None = None, line: int | None = None, column: int | None = None
    ) -> None:
        super().__init__(message)
        self.element = element
        self.line = line
        self.column = column

    def __reduce__(self):  # picklable across Ray processes with all its fields
        return (type(self), (self.args[0], self.element, self.line, self.column))


class JobError(Exception):
    """A background job (``POST /v1/audio/jobs``) the job store cannot take or give."""


class UnknownJobError(JobError):
    """No job with this id belongs to the caller: it never existed, expired, was deleted, or is
    another key's (all answered alike)."""


class TooManyJobs(JobError):
    """The caller has as many jobs queued or running as one key may (``jobs.max_active_jobs_per_key``):
    try again once one has finished."""


class JobQuotaExceeded(JobError):
    """The caller's jobs hold as many jobs or bytes as one key may keep (``jobs.max_jobs_per_key``,
    ``jobs.max_bytes_per_key``): delete some first."""


class JobNotReady(JobError):
    """The job's audio was asked for before the job succeeded."""
