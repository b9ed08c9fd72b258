"""Text -> segment requests: the text front end, the voice and the pacing of one synthesis.

No torch and no model: the TextNormalizer stage runs this alone. The speaker of a seeded voice
is sampled later, where ChatTTS's speaker statistics live (``voices.SpeakerSampler``).

A plan's cost is bounded after normalisation (``SegmentConfig.max_segments``,
``max_request_seconds``, ``max_silence_seconds``): characters alone do not bound it (numbers read
out in full, tags, ``speed: 0.25``), so a plan past any limit raises ``RequestTooLarge``. The cost
is counted as the plan is made (``PlanCost``), a segment at a time, so planning stops at the first
limit crossed; a lexicon's aliases are bounded as the text grows, before it is normalised
(``max_lexicon_growth_chars``: ``InputTooLong``).
"""

from __future__ import annotations

from typing import Optional

from .config import SegmentConfig
from .errors import EmptyInputError, RequestTooLarge
from .pacing import TOKENS_PER_SECOND, expected_tokens, max_new_tokens, speed_tag_level
from .text import Segment, TextFrontend
from .text.lexicon import LexiconBudget, resolve_phonemes, strip_phonemes
from .types import Plan, ScriptPart, SegmentRequest, SynthesisOptions, Voice
from .voices import MAX_SEED, VoiceResolver, effective_seed


def segment_seed(seed: int, index: int) -> int:
    """Each segment of a request gets its own, reproducible seed."""
    return (seed + index * 7919) % (MAX_SEED + 1)


def source_texts(text: str, texts: list[str], spans: list[Optional[tuple[int, int]]]) -> list[str]:
    """What captions show per segment: ``text[span]`` where the segment has its span alone, else
    (no span, or a piece cut again after normalising) the normalised text."""
    shared = {span for span in spans if span is not None and spans.count(span) > 1}
    return [text[span[0] : span[1]] if span is not None and span not in shared else t for t, span in zip(texts, spans)]


def speech_seconds(reqs: list[SegmentRequest]) -> float:
    """Expected seconds of speech of these segments (their expected tokens at their speed)."""
    return sum(r.target_tokens or 0 for r in reqs) / TOKENS_PER_SECOND


def plan_silence(plan: Plan) -> float:
    """The silence a plan asks for: its lead-in and every pause after a segment."""
    return plan.lead_in + sum(plan.pauses)


def plan_seconds(plan: Plan) -> float:
    """A plan's expected audio: speech and silence. The one cost every cap counts (a request's
    ``max_request_seconds``, a job's reservation)."""
    return speech_seconds(plan.segments) + plan_silence(plan)


class PlanCost:
    """One plan's cost as it is made: its segments, their expected speech and the silence asked
    for, ``RequestTooLarge`` at the first limit crossed (the figures in the message are what was
    counted by then); and what a lexicon may still add to its text (``lexicon``), charged to
    ``growth`` as well where the plan is one of several counted together (a job's chunks)."""

    def __init__(self, limits: SegmentConfig, opts: SynthesisOptions, growth: Optional[LexiconBudget] = None):
        self.limits = limits
        self.speed = opts.speed
        self.segments = 0
        self.tokens = 0
        self.silence = 0.0
        self.lexicon = LexiconBudget(limits.max_lexicon_growth_chars, outer=growth)

    def add_silence(self, seconds: float) -> None:
        self.silence += seconds
        self._check()

    def add_segment(self, target_tokens: int) -> None:
        self.segments += 1
        self.tokens += target_tokens
        self._check()

    def _check(self) -> None:
        limits = self.limits
        if self.segments > limits.max_segments:
            raise RequestTooLarge(
                f"input makes more than {limits.max_segments} segments after normalisation; the limit is "
                f"{limits.max_segments} (segments.max_segments): send less text"
            )
        if self.silence > limits.max_silence_seconds:
            raise RequestTooLarge(
                f"input asks for {self.silence:.0f} s of silence (breaks and pauses, all turns together); "
                f"the limit is {limits.max_silence_seconds:g} s (segments.max_silence_seconds)"
            )
        seconds = self.tokens / TOKENS_PER_SECOND + self.silence
        if seconds > limits.max_request_seconds:
            raise RequestTooLarge(
                f"input is more than {seconds:.0f} s of audio at speed {self.speed:g}; the limit is "
                f"{limits.max_request_seconds:g} s (segments.max_request_seconds): send less text "
                "or a higher speed"
            )


def normalization(opts: SynthesisOptions) -> tuple[bool, bool]:
    """(normalise numbers and symbols, read digits as written) for ``text_normalization``: on,
    off (the text as written: digits one by one, nothing else read), auto (as ``normalize`` says)."""
    mode = opts.text_normalization
    if mode == "off":
        return False, True
    return (True if mode == "on" else opts.normalize), False


class Planner:
    def __init__(self, limits: SegmentConfig = SegmentConfig(), frontend: Optional[TextFrontend] = None):
        self.limits = limits
        self.frontend = frontend or TextFrontend()
        self.voices = VoiceResolver()

    def warmup(self) -> None:
        self.frontend.warmup()

    def plan(
        self,
        text: str,
        opts: SynthesisOptions,
        voice: Optional[Voice] = None,
        client: str = "",
        growth: Optional[LexiconBudget] = None,
    ) -> Plan:
        """``voice``: already resolved (a stored custom voice the Ingress looked up); else
        ``opts.voice`` is resolved here. ``client``: who asked (stamped on every segment).
        ``growth``: a lexicon budget the plan's growth is charged to as well (``PlanCost``)."""
        segments = self._segments(text, opts, PlanCost(self.limits, opts, growth), speed_tag_level(opts.speed))
        plan = self.plan_texts([s.text for s in segments], opts, voice, client, spans=[s.span for s in segments])
        plan.sources = source_texts(text, plan.texts, plan.spans)
        return plan

    def plan_script(
        self,
        parts: list[ScriptPart],
        opts: SynthesisOptions,
        client: str = "",
        growth: Optional[LexiconBudget] = None,
    ) -> Plan:
        """One plan of several parts (voices, speeds, prompts, pauses between them): each part
        cut and normalised as ``plan`` cuts a text, its segments seeded by their place in the
        whole script (the same seeds whatever the parts), all of them decoding together.
        ``growth``: as ``plan``'s."""
        reqs: list[SegmentRequest] = []
        plan = Plan(parts[0].voice if parts else self.voices.resolve(opts.voice), reqs, [], gain_db=opts.volume)
        cost = PlanCost(self.limits, opts, growth)
        # Every pause lands somewhere (the lead-in, after a segment, the end): the script's whole
        # silence, refused before any text is normalised.
        cost.add_silence(sum(part.pause_before for part in parts))
        pause = 0.0
        for part in parts:
            pause += part.pause_before
            own = part.offset is not None
            # An SSML piece may hold phonemes: the model reads their characters, captions the written ones.
            written = part.text if own else strip_phonemes(part.text)
            level = speed_tag_level(part.speed)
            segments = self._segments(part.text if own else resolve_phonemes(part.text), opts, cost, level)
            if not segments:
                continue  # nothing speakable (a break alone): its pause goes on to the next part
            if pause > 0:
                if plan.segments:
                    plan.pauses[-1] += pause
                else:
                    plan.lead_in = pause
                pause = 0.0
            seed = effective_seed(part.voice, opts.seed)
            spans = [
                None if s.span is None or part.offset is None else (part.offset + s.span[0], part.offset + s.span[1])
                for s in segments
            ]
            texts = [s.text for s in segments]
            sources = (
                source_texts(part.text, texts, [s.span for s in segments])
                if own
                else ([written] if len(segments) == 1 else texts)
            )
            for seg, span, source in zip(segments, spans, sources):
                i = len(reqs)
                reqs.append(
                    self._request(
                        seg.text,
                        part.voice,
                        segment_seed(seed, i),
                        level,
                        f"[speed_{level}]{part.prompt}",
                        opts,
                        client,
                    )
                )
                plan.texts.append(seg.text)
                plan.spans.append(span if own else part.span)
                plan.sources.append(source)
                plan.pauses.append(0.0)
                plan.speakers.append(part.speaker)
                plan.turns.append(part.turn)
        if not reqs:
            raise EmptyInputError("input has nothing to speak (only punctuation, tags, breaks or whitespace)")
        plan.pauses[-1] += pause  # a break at the very end
        return plan

    def _segments(self, text: str, opts: SynthesisOptions, cost: PlanCost, level: int) -> list[Segment]:
        """``text``'s segments, each counted into ``cost`` (at speed tag ``level``) as it is made."""
        normalize, literal = normalization(opts)
        out: list[Segment] = []
        for segment in self.frontend.segments(
            text,
            lang=opts.lang,
            normalize=normalize,
            max_chars=self.limits.max_chars,
            max_seconds=self.limits.max_seconds,
            literal=literal,
            lexicon=opts.pronunciations,
            budget=cost.lexicon,
        ):
            cost.add_segment(expected_tokens(segment.text, level))
            out.append(segment)
        return out

    def plan_texts(
        self,
        texts: list[str],
        opts: SynthesisOptions,
        voice: Optional[Voice] = None,
        client: str = "",
        spans: Optional[list] = None,
    ) -> Plan:
        """Segment requests for already normalised segment texts (e.g. after refine_text);
        ``spans``: where each text came from in the input, when known."""
        voice = voice if voice is not None else self.voices.resolve(opts.voice)
        spans = list(spans) if spans is not None else [None] * len(texts)
        kept = [(t, span) for t, span in zip(texts, spans) if t.strip()]
        texts, spans = [t for t, _ in kept], [span for _, span in kept]
        if not texts:
            raise EmptyInputError("input has nothing to speak (only punctuation, tags or whitespace)")
        level = speed_tag_level(opts.speed)
        prompt = f"[speed_{level}]{opts.prompt}"
        seed = effective_seed(voice, opts.seed)
        reqs = [
            self._request(text, voice, segment_seed(seed, i), level, prompt, opts, client)
            for i, text in enumerate(texts)
        ]
        self.check_cost(reqs, opts)
        return Plan(voice, reqs, texts, spans=spans, gain_db=opts.volume)

    def _request(
        self, text: str, voice: Voice, seed: int, level: int, prompt: str, opts: SynthesisOptions, client: str
    ) -> SegmentRequest:
        return SegmentRequest(
            text=text,
            spk_emb=voice.spk_emb,
            spk_seed=voice.seed,
            spk_smp=voice.spk_smp,
            txt_smp=voice.txt_smp,
            seed=seed,
            target_tokens=expected_tokens(text, level),
            max_new_tokens=max_new_tokens(text, self.limits, level),
            prompt=prompt,
            temperature=opts.temperature,
            top_p=opts.top_p,
            top_k=opts.top_k,
            priority=opts.priority,
            client=client,
        )

    def check_cost(self, reqs: list[SegmentRequest], opts: SynthesisOptions, silence: float = 0.0) -> None:
        """``RequestTooLarge`` past ``max_segments``, ``max_silence_seconds`` of ``silence``, or
        ``max_request_seconds`` of expected audio (speech and silence together): ``PlanCost`` over
        segments already made."""
        cost = PlanCost(self.limits, opts)
        cost.add_silence(silence)
        for r in reqs:
            cost.add_segment(r.target_tokens or 0)
