"""Vocoder/Encoder stage (CPU): drives one stream end to end.

It pulls the request's hidden-state chunks from the Acoustic stage, decodes them with the
sliding-window vocoder (ChatTTS Decoder + Vocos) and encodes them with one encoder per stream,
yielding bytes as they are made. Per-stream state (vocoder window, encoder) lives here, so the
GPU replica only ever does GPT work. It loads the Decoder and Vocos, and for voices made from a
clip or a seed the DVAE encoder and the speaker statistics (``encode_clip``, ``speaker_for_seed``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator, Optional, Union

import torch
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.backends import install
from deployments.routing import HEADROOM
from deployments.stage_calls import stage_handle
from serve_app import metrics
from serve_app.engine.assembly import AudioLoop
from serve_app.engine.audio import SAMPLE_RATE
from serve_app.engine.clips import ClipLimits, EncodedClip, load_voice_encoder
from serve_app.engine.config import ModelConfig, VocoderConfig
from serve_app.engine.playback import PREBUFFER_S, PlaybackClock
from serve_app.engine.stream_gate import StreamGate
from serve_app.engine.threads import TorchThread
from serve_app.engine.types import Plan, SegmentMark, StreamSummary
from serve_app.engine.vocoder import VocoderEngine
from serve_app.engine.weights.loading import load_vocoder
from serve_app.pipeline.flow import AckedStream, FlowCredit, FlowRef, board, board_name
from serve_app.settings import FlowConfig

log = logging.getLogger("ray.serve")


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 2)


# Replicas, resources and autoscaling come from the config file (config/serve.yaml).
@serve.deployment
class Vocoder:
    def __init__(
        self,
        acoustic: DeploymentHandle,
        model: dict | None = None,
        vocoder: dict | None = None,
        flow: dict | None = None,
        prebuffer_s: float = PREBUFFER_S,
        capacity_headroom: float = 0.15,
        capacity_wait_s: Optional[float] = 0.75,
    ):
        """``prebuffer_s``: the listener's, as its stalls are inferred; ``capacity_headroom``,
        ``capacity_wait_s``: the Acoustic stage's (``args.acoustic``), for this stage's own
        admission of real-time streams by its measured rate (``engine/stream_gate.py``)."""
        install()  # this process records metrics and reaches boards through Ray (backends.py: why here)
        t0 = time.perf_counter()
        self.flow = FlowConfig.model_validate(flow or {})
        self.prebuffer_s = prebuffer_s  # the listener's, as the engine assumes it (engine/playback.py)
        self.acoustic = stage_handle(acoustic, self.flow)
        self.flow_board = board_name(serve.get_replica_context().app_name)
        board(self.flow_board)  # created (or found) now, not on the first stream
        self.cfg = VocoderConfig.model_validate(vocoder or {})
        # All torch work of this replica on one thread, one OpenMP team (engine/threads.py).
        self._torch_thread = TorchThread("vocoder")
        model_cfg = ModelConfig.model_validate(model or {})
        parts = self._torch_thread.call(load_vocoder, model_cfg)
        self.vocoder = VocoderEngine(parts, self.cfg)
        # Voices from clips and seeds (engine/clips.py): the DVAE encoder and the speaker statistics.
        self.voice_encoder = self._torch_thread.call(load_voice_encoder, model_cfg)
        self._torch_thread.call(self.vocoder.decode, torch.zeros(8, 768))  # warm-up: first conv/ISTFT calls allocate
        # Real-time streams by this replica's measured rate: a stream it cannot keep at 1x is refused.
        self.gate = StreamGate(capacity_headroom, capacity_wait_s)
        self.audio_s = 0.0  # audio made (what the gate's rate counts)
        self._reports = asyncio.get_event_loop().create_task(self._report())
        log.info("Vocoder ready in %.1fs", time.perf_counter() - t0)

    async def _report(self) -> None:
        """Every second: the gate's rate from the torch thread's busy time, and the gauges."""
        refused = 0
        while True:
            await asyncio.sleep(1.0)
            gate = self.gate
            gate.measure(self._torch_thread.busy_s, self.audio_s)
            if gate.capacity_streams is not None:
                metrics.set_gauge("tts_realtime_capacity_streams", gate.capacity_streams, stage="vocoder")
            metrics.set_gauge("tts_realtime_demand_streams", gate.inside, stage="vocoder")
            if gate.refused > refused:
                metrics.inc("tts_capacity_refusals_total", gate.refused - refused, stage="vocoder")
                refused = gate.refused

    def record_routing_stats(self) -> dict[str, float]:
        """Real-time streams this replica can still take at 1x (deployments/routing.py)."""
        cap = self.gate.capacity_streams
        return {} if cap is None else {HEADROOM: float(cap - self.gate.inside)}

    async def stream(
        self, plan: Plan, response_format: str, flow: Optional[FlowRef] = None
    ) -> AsyncIterator[Union[bytes, SegmentMark, StreamSummary]]:
        """Encoded audio bytes as they are made, a ``SegmentMark`` right after the bytes that
        complete each segment, then one ``StreamSummary`` (the engine's ``AudioLoop``). The
        Acoustic stage stays at most a window ahead of what this stream has decoded, and with
        ``flow`` this stream stays at most its window ahead of what the caller has taken
        (pipeline/flow.py)."""
        t0 = time.perf_counter()
        # The listener's clock as this stream infers it: audio counted as each block leaves.
        listener = PlaybackClock(self.prebuffer_s)
        sent_samples = 0
        run = self._torch_thread.acall
        realtime = bool(plan.segments) and plan.segments[0].realtime
        if realtime:
            ahead = plan.segments[0].ahead_s
            await self.gate.enter(continuing=ahead > 0)  # refused (503) when no room comes in time
            opened = time.monotonic()

            def run(fn, *args):
                # Windows of the streams closest to silence first (before its first audio: minus
                # the wait, or what its listener holds of the audio before it).
                slack = listener.slack() if listener.started else ahead - (time.monotonic() - opened)
                return self._torch_thread.acall_within(slack, fn, *args)

        loop = AudioLoop(self.vocoder, plan, response_format, self.cfg, run)
        upstream = FlowRef.new(self.flow_board, self.flow.window) if self.flow.enabled else None
        chunks = AckedStream(self.acoustic.options(stream=True).stream.remote(plan.segments, upstream), upstream)
        credit = FlowCredit(flow)

        async def hidden():
            async for wire in chunks:
                loop.batch_rows = loop.batch_rows or wire.batch_rows
                if wire.hops is not None and not loop.first_audio:
                    loop.first_audio.update(wire.hops, acoustic_call=_ms(time.perf_counter() - t0))
                yield wire.segment, wire.hidden, wire.final

        done = False
        try:
            async for item in loop.items(hidden()):
                if isinstance(item, bytes):
                    t_credit = time.perf_counter()
                    await credit.ready()
                    listener.deliver((loop.yielded_samples - sent_samples) / SAMPLE_RATE)
                    self.audio_s += (loop.yielded_samples - sent_samples) / SAMPLE_RATE
                    sent_samples = loop.yielded_samples
                    if "vocoder_total" not in loop.first_audio:
                        first = loop.first_window or {}
                        loop.first_audio.update(
                            vocoder_feed=_ms(first.get("feed", 0.0)),
                            vocode=_ms(first.get("vocode", 0.0)),
                            encode=_ms(first.get("encode", 0.0)),
                            vocoder_credit=_ms(time.perf_counter() - t_credit),
                            vocoder_total=_ms(time.perf_counter() - t0),
                        )
                elif isinstance(item, StreamSummary):
                    done = True
                    item.stall_s, item.min_slack_s = round(listener.stall_s, 3), listener.min_slack_s
                    elapsed = time.perf_counter() - t0
                    metrics.inc("tts_audio_seconds_total", item.audio_seconds)
                    if item.audio_seconds > 0:
                        metrics.observe("tts_rtf", elapsed / item.audio_seconds)
                    metrics.observe("tts_stage_seconds", item.vocode_seconds, stage="vocode")
                    metrics.observe("tts_stage_seconds", item.encode_seconds, stage="encode")
                yield item
        finally:
            if realtime:
                self.gate.leave()
            if done:
                chunks.close()
            else:  # the caller went away or a stage failed: stop the decode too
                chunks.cancel()

    async def encode_clip(self, data: bytes, min_seconds: float, max_seconds: float) -> EncodedClip:
        """A reference clip (any audio file) -> ChatTTS's prompt string of its audio codes.
        ``InvalidClipError`` when it is not usable. Runs on the replica's one torch thread: a
        clip's encoding delays this replica's streams by as long (voices are made rarely)."""
        t0 = time.perf_counter()
        clip = await self._torch_thread.acall(
            self.voice_encoder.encode_file, data, ClipLimits(min_seconds, max_seconds)
        )
        metrics.observe("tts_stage_seconds", time.perf_counter() - t0, stage="encode_clip")
        return clip

    async def speaker_for_seed(self, seed: int) -> str:
        """The speaker string of ``seed:<n>``, to store with a voice made from a seed."""
        return await self._torch_thread.acall(self.voice_encoder.speaker_for_seed, seed)
