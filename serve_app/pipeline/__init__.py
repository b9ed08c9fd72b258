"""Text to audio, once: the speech pipeline every front door speaks through, and the admission
step every front door takes before it.

``prepare``: one way to prepare a request for every door (``Preparation.prepare(request, caller)``:
admission, then its script, ``script``: instructions, SSML, a dialogue's turns, voices, lexicon).
``interface``: what a pipeline is (script -> plan (-> refine) -> a stream of bytes and segment
marks, cancelled on exit). ``stream``: that stream, the one place its stages' work is stopped.
``handles``: the pipeline over the Serve stages' handles (HTTP speech and dialogue, WebSocket
sessions, the job runner). ``local``: the same over the engine's pieces in one process (tests,
tools). ``admission``: model, length, priority, voice, lexicon, busy switch and stream slot, in
that order, each door asking for the steps it takes. No Ray import here: a Serve handle comes in
as a plain object with ``.remote`` and ``.options(stream=True)``.
"""

from .admission import Admission, Admitted, check_length, check_model
from .handles import HandlesPipeline
from .interface import AudioItem, SpeechPipeline
from .prepare import Preparation, Prepared
from .script import Script
from .stream import AudioStream

__all__ = [
    "Admission",
    "Admitted",
    "AudioItem",
    "AudioStream",
    "HandlesPipeline",
    "Preparation",
    "Prepared",
    "Script",
    "SpeechPipeline",
    "check_length",
    "check_model",
]
