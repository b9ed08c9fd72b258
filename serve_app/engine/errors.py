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


class VoiceError(ValueError):
    """A voice string that cannot be used."""


class UnknownVoiceError(VoiceError):
    """The voice names no voice (not a built-in name, ``seed:<n>`` or a speaker string)."""


class InvalidVoiceError(VoiceError):
    """The voice looks like a seed or a speaker string but is malformed or out of range."""


class EmptyInputError(ValueError):
    """The text has nothing speakable (only punctuation, tags or whitespace)."""


class InvalidClipError(ValueError):
    """A reference clip for a voice cannot be used: undecodable, too short or long, silent."""
