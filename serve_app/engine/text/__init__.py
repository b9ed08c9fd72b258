"""Text front end for ChatTTS: control tags, language, numbers and symbols, segmentation.

ChatTTS can only pronounce CJK ideographs, Latin letters and ``，。、,. `` (plus its control
tags); anything else (digits, %, $, :, ...) is silently dropped by its ``Normalizer``. This
package turns numbers and symbols into words first, per language, then does ChatTTS's own
clean-up (homophone replacement, invalid-character removal), and cuts the text into segments
the model can say in one go.

Modules, in the order text goes through them (``TextFrontend.process``):

* ``tags``     the control tags a user may write (``CONTROL_TAG_RE``); any other bracket is
               removed, so users cannot inject internal tokens such as ``[spk_emb]``.
* ``chars``    the one definition of the CJK ranges and of what is speakable; ``text_length``.
* ``segment``  sentence / clause / word cuts to ``max_chars`` and ``max_seconds``; cuts of text
               still being written (``split_unfinished``, streaming sessions).
* ``lang``     zh or en, per sentence, by dominant script.
* ``zh``, ``en``  number, date, time, money, unit and symbol readings: ordered regex passes
               (shared patterns in ``patterns``), tables under ``data/``.
* ``chattts_norm``  what ChatTTS's ``Normalizer`` then does (homophones, unsayable
               characters), reimplemented over ChatTTS's own homophone table and checked against
               ChatTTS in the tests: importing ChatTTS would import torch.
* ``frontend`` ``TextFrontend``: all of the above, per request.

Nothing here imports torch, ChatTTS's package, Ray or HTTP code: a text-only process (the
normaliser replica) stays small.

Why our own rules and not WeTextProcessing (measured with ``python -m bench.text_compare``,
numbers in bench/README.md, "Text front end"): its runtime ``wetext`` is ~30x slower per
sentence, ships ~46 MB of FSTs plus kaldifst, knows nothing of ChatTTS's control tags, and on
our corpus misreads what a TTS service sees daily ("1.82 m" as minutes, "1990s" as seconds,
"$1,299" in Chinese as "一美元,两百九十九", "10%-20%" as 负二十); the grammar package
WeTextProcessing needs pynini (a 165 MB wheel) and is slower still. English number words come
from ``num2words`` (pure Python, offline).
"""

from .chars import is_speakable, text_length
from .en import normalize_numbers_en
from .frontend import Segment, TextFrontend
from .lang import Lang, detect_language
from .segment import segment_fits, split_segments, split_unfinished
from .tags import CONTROL_TAG_RE
from .zh import normalize_numbers_zh

__all__ = [
    "CONTROL_TAG_RE",
    "Lang",
    "Segment",
    "TextFrontend",
    "detect_language",
    "is_speakable",
    "normalize_numbers_en",
    "normalize_numbers_zh",
    "segment_fits",
    "split_segments",
    "split_unfinished",
    "text_length",
]
