"""Text -> segment requests: the text front end, the voice and the pacing of one synthesis.

No torch and no model: the TextNormalizer stage runs this alone. The speaker of a seeded voice
is sampled later, where ChatTTS's speaker statistics live (``voices.SpeakerSampler``).
"""

from __future__ import annotations

from typing import Optional

from .config import SegmentLimits
from .errors import EmptyInputError
from .pacing import expected_tokens, max_new_tokens, speed_tag_level
from .text import TextFrontend
from .types import Plan, SegmentRequest, SynthesisOptions, Voice
from .voices import MAX_SEED, VoiceResolver, effective_seed


def segment_seed(seed: int, index: int) -> int:
    """Each segment of a request gets its own, reproducible seed."""
    return (seed + index * 7919) % (MAX_SEED + 1)


class Planner:
    def __init__(self, limits: SegmentLimits = SegmentLimits(), frontend: Optional[TextFrontend] = None):
        self.limits = limits
        self.frontend = frontend or TextFrontend()
        self.voices = VoiceResolver()

    def warmup(self) -> None:
        self.frontend.warmup()

    def plan(self, text: str, opts: SynthesisOptions, voice: Optional[Voice] = None) -> Plan:
        """``voice``: already resolved (a stored custom voice the Ingress looked up); else
        ``opts.voice`` is resolved here."""
        segments = self.frontend.process(
            text, lang=opts.lang, normalize=opts.normalize, max_chars=self.limits.max_chars,
            max_seconds=self.limits.max_seconds,
        )
        return self.plan_texts([s.text for s in segments], opts, voice)

    def plan_texts(self, texts: list[str], opts: SynthesisOptions, voice: Optional[Voice] = None) -> Plan:
        """Segment requests for already normalised segment texts (e.g. after refine_text)."""
        voice = voice if voice is not None else self.voices.resolve(opts.voice)
        texts = [t for t in texts if t.strip()]
        if not texts:
            raise EmptyInputError("input has nothing to speak (only punctuation, tags or whitespace)")
        level = speed_tag_level(opts.speed)
        prompt = f"[speed_{level}]{opts.prompt}"
        seed = effective_seed(voice, opts.seed)
        reqs = [
            SegmentRequest(
                text=text,
                spk_emb=voice.spk_emb,
                spk_seed=voice.seed,
                spk_smp=voice.spk_smp,
                txt_smp=voice.txt_smp,
                seed=segment_seed(seed, i),
                target_tokens=expected_tokens(text, level),
                max_new_tokens=max_new_tokens(text, self.limits, level),
                prompt=prompt,
                temperature=opts.temperature,
                top_p=opts.top_p,
                top_k=opts.top_k,
                priority=opts.priority,
            )
            for i, text in enumerate(texts)
        ]
        return Plan(voice, reqs, texts)
