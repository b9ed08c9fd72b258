"""The answers cache as speech uses it: a request's key, the lookup its Cache-Control allows
(counted, and recorded on the request), and a finished stream stored whole with its timing."""

from __future__ import annotations

import asyncio
import json
from typing import Optional

from .. import metrics
from ..engine.types import Voice
from ..pipeline.script import Script
from ..protocol import SpeechRequest, SpeechSegment
from ..settings import CacheConfig
from ..storage.cache import make_cache, request_key
from .answers import Hit, segments_key, whole
from .request_log import RequestRecord


class SpeechCache:
    def __init__(self, config: CacheConfig):
        self.config = config
        self.store = make_cache(config)

    def key(self, req: SpeechRequest, voice: Voice, script: Script, weights_id: str, owner: str) -> Optional[str]:
        """The request's key; None while the weights are unknown (audio is only valid for the same
        weights and engine code). A cache not shared across keys is each owner's own."""
        if weights_id == "unknown":
            return None
        return request_key(
            req,
            voice,
            weights_id=weights_id,
            options=script.options,
            voices=[v.cache_id for v in script.voices],
            scope="" if self.config.share_across_keys else owner,
        )

    async def lookup(
        self, key: Optional[str], cache_control: str, rec: RequestRecord, timed: bool
    ) -> tuple[Optional[str], Optional[Hit]]:
        """The key to store under (None: ``no-store``, or no key) and the hit, if any. ``no-cache``
        skips the lookup (fresh synthesis, still stored), ``no-store`` also skips storing."""
        directives = {d.strip().lower() for d in cache_control.split(",")}
        if key is not None and "no-store" in directives:
            key = None
            metrics.inc("tts_cache_total", result="bypass")
        elif key is not None and "no-cache" in directives:
            rec.cache = "miss"
            metrics.inc("tts_cache_total", result="miss")
        elif key is not None:
            hit = await self.get(key, timed)
            rec.cache = "hit" if hit is not None else "miss"
            metrics.inc("tts_cache_total", result=rec.cache)
            return key, hit
        else:
            metrics.inc("tts_cache_total", result="bypass")
        return key, None

    async def get(self, key: str, timed: bool) -> Optional[Hit]:
        """``timed``: the caller needs the segments' timing, so only a hit stored with it counts."""
        audio = await self.store.get(key)
        if audio is None or not timed:
            return None if audio is None else Hit(audio)
        stored = await self.store.get(segments_key(key))
        if stored is None:
            return None  # stored without its timing: synthesise again (and store both)
        timing = json.loads(stored)
        return Hit(audio, [SpeechSegment.model_validate(s) for s in timing["segments"]], timing["duration"])

    async def put(self, key: str, parts: list[bytes], segments: list[SpeechSegment], duration: float) -> None:
        """Stored whole: a hit is one answer, with its true length (joined off the loop)."""
        await self.store.put(key, await asyncio.to_thread(whole, parts))
        timing = {"segments": [seg.model_dump() for seg in segments], "duration": duration}
        await self.store.put(segments_key(key), json.dumps(timing).encode())
