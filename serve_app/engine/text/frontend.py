"""``TextFrontend``: raw request text -> normalised segments, each with its language."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Iterator, List, Optional

from .chars import WS_RE, is_speakable, sanitize
from .chattts_norm import ChatTTSNormalizer
from .en import normalize_numbers_en
from .lang import Lang, check_lang, detect_language, detect_or
from .lexicon import LexiconBudget, LexiconEntry, Pronunciations, apply_lexicon
from .pinyin import syllable_table
from .segment import check_max_chars, locate_pieces, segment_fits, split_segments, split_sentences
from .tags import strip_stray_brackets
from .zh import normalize_numbers_zh

__all__ = ["Segment", "TextFrontend"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Segment:
    text: str  # normalised, ready for the ChatTTS tokenizer
    lang: Lang
    # Where it came from in the input (character offsets); the parts of a piece that grew past
    # max_chars when normalised share its span. Not part of what a segment is (equality).
    span: Optional[tuple[int, int]] = field(default=None, compare=False)


# Commas right after another mark add nothing ("，，" / "。，" / ", ,").
_FINAL_PUNCT_RUN_RE = re.compile(r"[，、,]+(?=[。.])|(?<=[，。、,.])\s*[，、,]+")
_LEADING_PUNCT_RE = re.compile(r"^[\s，。、,.]+")


def _tidy(text: str) -> str:
    text = WS_RE.sub(" ", text)
    text = re.sub(r" +(?=[，。、,.])", "", text)
    text = _FINAL_PUNCT_RUN_RE.sub("", text)
    text = re.sub(r"(?<=[,.])(?=[A-Za-z])", " ", text)  # "(approx.)" left "cents,approximately"
    return _LEADING_PUNCT_RE.sub("", text).strip()


class TextFrontend:
    """Splits text into segments and normalises each: our zh/en number passes, then ChatTTS's
    clean-up (homophones, unsayable characters; ``chattts_norm``). Torch-free and stateless
    after construction, so one instance serves every thread."""

    def __init__(self, homophones_map_path: Optional[str] = None) -> None:
        self._normalizer = ChatTTSNormalizer(
            {"zh": normalize_numbers_zh, "en": normalize_numbers_en}, homophones_map_path
        )

    def warmup(self) -> float:
        """Run every path once (first calls fill num2words' and the regex module's caches);
        returns seconds taken."""
        start = time.perf_counter()
        samples = (
            ("你好[uv_break]，价格是$20。", "zh"),
            ("行不行", "zh"),
            ("Hello [laugh] world 3.5%.", "en"),
            ("plain text", "en"),
        )
        for sample, lang in samples:
            self.normalize(sample, lang=lang)
            self.normalize(sample, lang=lang, do_normalize=False, do_homophones=False)
        # A pinyin entry's reading: pypinyin's table is built here (~0.5 s), not in a request.
        syllable_table()
        self.process("银行", lexicon=Pronunciations(entries=(LexiconEntry(text="银行", pinyin="yin2 hang2"),)))
        elapsed = time.perf_counter() - start
        logger.info("text front end warm-up took %.2fs", elapsed)
        return elapsed

    def normalize(
        self,
        text: str,
        lang: Optional[str] = None,
        do_normalize: bool = True,
        do_homophones: bool = True,
        literal: bool = False,
    ) -> str:
        """Numbers/symbols to words (per sentence language unless ``lang`` is given), then
        ChatTTS's homophone replacement and invalid-character removal. Keeps control tags.
        ``literal`` (``do_normalize`` off): digits read one by one, as written.
        Returns "" when nothing speakable remains."""
        if not isinstance(text, str):
            raise ValueError(f"text must be str, got {type(text).__name__}")
        check_lang(lang)
        text = strip_stray_brackets(sanitize(text))
        if not text.strip():
            return ""
        default: Lang = lang or detect_language(text)  # type: ignore[assignment]
        out = []
        for sentence in split_sentences(text):
            if not sentence.strip():
                out.append(" ")
                continue
            sentence_lang: Lang = lang or detect_or(sentence, default)  # type: ignore[assignment]
            out.append(
                self._normalizer(sentence.replace("\n", " "), sentence_lang, do_normalize, do_homophones, literal)
            )
        result = _tidy("".join(out))
        return result if is_speakable(result) else ""

    def process(
        self,
        text: str,
        lang: Optional[str] = None,
        normalize: bool = True,
        max_chars: int = 120,
        max_seconds: Optional[float] = None,
        literal: bool = False,
        lexicon: Optional[Pronunciations] = None,
        budget: Optional[LexiconBudget] = None,
    ) -> List[Segment]:
        """Every segment of ``text`` (``segments``, whole)."""
        segments = list(self.segments(text, lang, normalize, max_chars, max_seconds, literal, lexicon, budget))
        logger.debug("text front end produced %d segment(s) from %d chars", len(segments), len(text))
        return segments

    def segments(
        self,
        text: str,
        lang: Optional[str] = None,
        normalize: bool = True,
        max_chars: int = 120,
        max_seconds: Optional[float] = None,
        literal: bool = False,
        lexicon: Optional[Pronunciations] = None,
        budget: Optional[LexiconBudget] = None,
    ) -> Iterator[Segment]:
        """Split (on the raw text), apply the lexicon to each piece, normalise it, drop empty ones;
        one piece at a time, so a caller that counts the cost stops the work at its limit.

        ``normalize=False`` skips number/symbol normalisation only: the text still goes
        through homophone replacement and invalid-character removal, so it is always safe
        for the tokenizer (digits are then dropped, as ChatTTS would; with ``literal`` they are
        read one by one: ``text_normalization: off``). Segments that grow past ``max_chars``
        when normalised are split again; text is never truncated. The lexicon applies after the
        cut, so each segment's span is still where its written text is in ``text``; ``budget``:
        what its aliases may add, every piece together (``InputTooLong`` as the text passes it,
        before that piece is normalised).
        """
        if not isinstance(text, str):
            raise ValueError(f"text must be str, got {type(text).__name__}")
        check_lang(lang)
        check_max_chars(max_chars)
        pieces = split_segments(text, max_chars, max_seconds)
        for raw, span in zip(pieces, locate_pieces(text, pieces)):
            read = apply_lexicon(raw, lexicon, budget)
            normed = self.normalize(read, lang=lang, do_normalize=normalize, literal=literal)
            if not normed:
                continue
            fits = segment_fits(normed, max_chars, max_seconds)
            parts = [normed] if fits else split_segments(normed, max_chars, max_seconds)
            # Detected on the normalised text: numbers are words by now, in the
            # language they were normalised in.
            for p in parts:
                yield Segment(text=p, lang=lang or detect_language(p), span=span)  # type: ignore[arg-type]
