"""Pydantic configuration of the engine: weights, device, decoding and vocoding knobs.

Every knob the serving layer or the CLI can set lives here, so one model validates a
deployment's args and the CLI's flags alike.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from .playback import PREBUFFER_S
from .strict import StrictModel

WeightsSource = Literal["auto", "huggingface", "local", "random", "random-tiny", "random-deep"]
Device = Literal["auto", "cpu", "cuda", "mps"]
DType = Literal["float32", "float16", "bfloat16"]

# Environment override of the configured weights source (tests and demos switch without editing config).
WEIGHTS_ENV = "CHATTTS_WEIGHTS"
WEIGHTS_PATH_ENV = "CHATTTS_WEIGHTS_PATH"
CACHE_ENV = "CHATTTS_SERVE_CACHE"
# Tokens the sliding-window vocoder holds back as right context (VocoderConfig), so what a
# listener has heard lags what the Acoustic stage sent by that much (AcousticConfig).
HOLD_BACK_TOKENS = 4
# A segment's first vocoder window, in tokens (engine/vocoder.py's ``window_ends``): the first
# chunk (12) less the hold-back, so the first audio needs one window.
MIN_WINDOW_TOKENS = 8
# The vocoder's windows after the ramp from MIN_WINDOW_TOKENS: the chunk the Acoustic stage sends.
WINDOW_TOKENS = 24
# The listener's prebuffer the deadline rule counts on: what a listener holds (PREBUFFER_S, 0.5 s)
# less what the engine's audio still has to go through (the hold-back, a window's vocode and send).
SCHEDULING_PREBUFFER_S = round(PREBUFFER_S - 0.2, 3)


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "chattts-serve"


class WeightsConfig(StrictModel):
    source: WeightsSource = "auto"
    path: Optional[str] = Field(default=None, description="Asset directory (ChatTTS layout) for source=local.")
    cache_dir: Optional[str] = Field(
        default=None, description="Where random weights are built (default ~/.cache/chattts-serve)."
    )
    seed: int = Field(default=0, description="Seed of random weights (part of the cache key).")
    hub_timeout_s: float = Field(default=10.0, gt=0, description="source=auto: give up on the hub after this long.")

    def resolved(self) -> "WeightsConfig":
        """Apply the CHATTTS_WEIGHTS / CHATTTS_WEIGHTS_PATH overrides."""
        update = {}
        env = os.environ.get(WEIGHTS_ENV)
        if env:
            update["source"] = env
        env_path = os.environ.get(WEIGHTS_PATH_ENV)
        if env_path:
            update["path"] = env_path
        if not update:
            return self
        return WeightsConfig.model_validate({**self.model_dump(), **update})

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()


class ModelConfig(StrictModel):
    weights: WeightsConfig = WeightsConfig()
    device: Device = "auto"
    dtype: DType = Field(
        default="float32",
        description="GPT dtype; float16/bfloat16 only make sense on a GPU.",
    )
    torch_threads: Optional[int] = Field(
        default=None, ge=1, description="torch.set_num_threads for this process (None: torch default)."
    )
    cpu_dual_layout: bool = Field(
        default=True,
        description="On CPU in float32, keep a transposed copy of each GPT linear weight for steps "
        "of 4+ rows (engine/linear.py: faster few-row decode steps for one more copy of those weights).",
    )
    mmap_threshold_bytes: Optional[int] = Field(
        default=1 << 20,
        ge=4096,
        le=1 << 25,
        description="glibc's mmap threshold for the model processes (engine/heap.py): blocks this large "
        "get their own mappings and go back to the system when freed, instead of staying in the heap "
        "(lower peak RSS while rows come and go). null keeps glibc's dynamic threshold.",
    )
    quantize: Literal["auto", "none", "int8"] = Field(
        default="auto",
        description="int8: the GPT's attention and MLP weights in int8 on CPU (engine/quant.py: a quarter of "
        "the bytes per decode step, ~1% error per layer, teacher-forced hidden states within cosine 0.9997 of "
        "float32's; replaces cpu_dual_layout). auto (the default): int8 where the GPT runs on CPU in float32 "
        "(Serve at 8 clients, full size: 3.2x the audio per second of float32, bench/README.md), none on a GPU. "
        "int8 is refused with device cuda/mps and ignored with a warning when device auto finds a GPU.",
    )

    @model_validator(mode="after")
    def _check_quantize(self) -> "ModelConfig":
        if self.quantize == "int8" and (self.device in ("cuda", "mps") or self.dtype != "float32"):
            raise ValueError(f"quantize {self.quantize} is for device cpu (or auto) in float32")
        return self

    def quantize_on(self, device: Any) -> str:
        """The quantize mode for a GPT on ``device``: ``auto`` is int8 on CPU in float32."""
        if self.quantize != "auto":
            return self.quantize
        return "int8" if getattr(device, "type", str(device)) == "cpu" and self.dtype == "float32" else "none"


class AcousticConfig(StrictModel):
    """Decode-loop knobs (docs/architecture.md, "The decode loop")."""

    max_rows: int = Field(default=16, ge=1, description="Rows decoded together at most.")
    token_budget: int = Field(
        default=16384,
        ge=64,
        description="Sum over running rows of prompt + max new tokens (bounds KV memory).",
    )
    first_chunk_tokens: int = Field(default=12, ge=1, description="Tokens in a row's first chunk (first audio sooner).")
    chunk_tokens: int = Field(default=24, ge=1, description="Tokens per chunk after the first.")
    listener_margin_s: Optional[float] = Field(
        default=0.1,
        ge=0,
        description="Send a chunk before chunk_tokens are pending (at least min_early_chunk_tokens) when "
        "waiting for the full chunk would let a listener who started playing at the row's first audio run "
        "dry within this many seconds; only while decode steps are faster than real time (a slower "
        "batch cannot keep up anyway, and smaller chunks would only cost vocoder calls). None: fixed "
        "chunk sizes, the same for every run, so repeats are byte-identical (docs/architecture.md).",
    )
    min_early_chunk_tokens: int = Field(
        default=MIN_WINDOW_TOKENS,
        ge=1,
        description="An early chunk's tokens at least: the vocoder's min_window_tokens, fewer play nothing (the app sets it from there).",
    )
    listener_lag_tokens: int = Field(
        default=HOLD_BACK_TOKENS,
        ge=0,
        description="Tokens sent but not yet heard: the vocoder's hold_back_tokens (the app sets it from there).",
    )
    max_stream_chunks: Optional[int] = Field(
        default=16,
        ge=2,
        description="Chunks a row's stream may hold that its consumer has not taken (the stage after the GPT, or "
        "a client, falling behind): at this many the row is parked, its KV set aside and its slot freed, and it "
        "comes back where it left off once the backlog is half gone. 16 chunks are ~8 s of audio ahead of the "
        "reader (~1.2 MB of float32 hidden states): above a whole segment of max_seconds 4.0 (~9 chunks), so a "
        "later segment waiting for the ones before it to be read is not parked. Where the transport between "
        "stages applies back-pressure (Serve's gRPC transport: docs/architecture.md), a slow listener bounds "
        "the whole chain. None: never park.",
    )
    continuous: bool = Field(
        default=True,
        description="Admit new rows between steps (iteration-level batching); "
        "False runs each batch to its end (window batching, for comparison).",
    )
    max_queued_rows: int = Field(
        default=2048,
        ge=1,
        description="Rows waiting for a slot at most, all clients together; past it a request gets 503 "
        "overloaded. A waiting row holds no KV (a few KB), and a request's segments are queued together, so "
        "this is several of the largest requests (SegmentConfig.max_segments) at once.",
    )
    max_queued_rows_per_client: int = Field(
        default=512,
        ge=1,
        description="Rows one client (API key, or address without keys) may have waiting; a request that "
        "would go past it gets 429 too_many_queued_rows (its client's queued requests go on). The default is "
        "SegmentConfig.max_segments, so the largest request fits when its client has nothing else waiting, "
        "and a quarter of max_queued_rows, so one client cannot fill the queue for everyone.",
    )
    reserved_rows: int = Field(
        default=1,
        ge=0,
        description="Slots beyond max_rows that only a client with no row running may take: its first row "
        "joins at the next step even while another client's rows fill the batch (running rows are never "
        "stopped). The batch holds max_rows + reserved_rows rows at most, and a client never more than max_rows.",
    )
    max_running_rows_per_client: Optional[int] = Field(
        default=2,
        ge=1,
        description="While another client is present (rows waiting or running, now or within the last 10 s), "
        "a client's rows in the batch at most (None: no cap); a lone client takes every slot. Every row in a "
        "step slows every other row's step where a step's time grows with its rows (CPU). Measured on "
        "random-tiny weights beside a client with 200 segments queued: a polite first "
        "chunk ~1.5x its time alone with 2, ~1.7x with 4, ~3.2x uncapped (docs/architecture.md, 'The decode "
        "loop'). A contended client still decodes 2 segments at once, ahead of playback on a GPU; GPU "
        "replicas, whose steps barely slow with more rows, can raise it for throughput. With scheduling "
        "deadline it caps rows without a listener only: real-time streams are scheduled by their deadlines.",
    )
    scheduling: Literal["deadline", "fair"] = Field(
        default="deadline",
        description="deadline: rows of real-time streams (SegmentRequest.realtime) run least slack first (the "
        "stream closest to its listener hearing silence), rows far ahead of their listener are parked for more "
        "urgent ones or for cheaper steps, new streams start while the replica's measured capacity allows, and "
        "rows without a listener get what is left, shared fairly between clients, never starved "
        "(background_rows, background_wait_s). fair: every row shares admission by client and priority, and a "
        "running row is never parked for another (docs/architecture.md, 'The decode loop'). With continuous "
        "false, fair.",
    )
    prebuffer_s: float = Field(
        default=SCHEDULING_PREBUFFER_S,
        ge=0,
        le=10,
        description="Audio a real-time listener is assumed to buffer before it starts playing, for the deadline "
        "rule: a stream's slack is the audio sent minus the time since its first chunk, plus this. Listeners "
        "buffer ~0.5 s (playback.PREBUFFER_S: a phone line's jitter buffer, the web page, the streams "
        "benchmark's clients); the vocoder holds back hold_back_tokens (85 ms) and a window takes time to "
        "vocode and send, so the engine counts on 0.2 s less (0.3 s) and errs towards urgency. Read when a "
        "stream is submitted.",
    )
    park_ahead_s: float = Field(
        default=4.0,
        gt=0,
        description="scheduling deadline: a running real-time row at least this far ahead of its listener may be "
        "parked (its KV set aside) for a more urgent row when the batch is full, or to make steps cheaper when "
        "the replica's real-time rows run below 1x. Above resume_ahead_s by a margin (hysteresis): a parked row "
        "stays out until its slack falls below resume_ahead_s, so each park lasts at least the difference "
        "(2 s by default) and costs two copies of the row's KV and one re-pack of the batch (measured in "
        "docs/architecture.md).",
    )
    resume_ahead_s: float = Field(
        default=2.0,
        ge=0,
        description="scheduling deadline: a real-time row (waiting, or parked) with less slack than this is urgent "
        "and takes a slot least slack first, parking a running row at least park_ahead_s ahead if it must; a "
        "row with more waits for spare capacity. Covers its rejoining (a merge, a prefill) and its next chunk.",
    )
    capacity_headroom: float = Field(
        default=0.15,
        ge=0,
        lt=1,
        description="scheduling deadline: the replica can carry n real-time rows while its measured step time at n "
        "rows is at most one token's audio (21.3 ms) times (1 - headroom) (decode/capacity.py). New streams "
        "start, and work that is not urgent joins, within that; rows ahead of their listener or without one "
        "are parked when the step at the batch's size is slower than one token's audio (no headroom: the band "
        "between is the hysteresis).",
    )
    background_rows: int = Field(
        default=1,
        ge=1,
        description="scheduling deadline: slots rows without a listener keep against real-time rows: a row that has "
        "waited background_wait_s takes the next free slot (before any real-time row) while fewer than this "
        "many such rows run, and keeps it to its end. So jobs and bulk are never starved, and real-time "
        "streams lose at most this many slots to them.",
    )
    capacity_wait_s: Optional[float] = Field(
        default=0.75,
        ge=0,
        description="scheduling deadline: how long a new real-time stream may wait for room within the replica's "
        "measured capacity before it is refused (503 capacity_exhausted, Retry-After: the client's next try, or "
        "another replica, rather than a stream every listener would hear stall). A stream that gets room "
        "within it starts later and plays smoothly. None: wait as long as it takes.",
    )
    background_wait_s: float = Field(
        default=2.0,
        ge=0,
        description="scheduling deadline: how long a row without a listener waits (queued, or parked) before it is "
        "owed one of background_rows slots.",
    )
    cuda_graphs: bool = Field(
        default=False,
        description="CUDA only: replay each decode step from a CUDA graph captured per batch-size bucket "
        "(1, 2, 4 ... 64 rows; a batch is padded up) over static KV buffers; a step no graph fits runs "
        "eagerly (logged once per cause). Read when the engine is built.",
    )
    refine_max_chars: int = Field(
        default=2048,
        ge=1,
        description="refine_text: characters of (normalised) text per call at most; more is 413 "
        "request_too_large. refine is a second generation over the text, before any audio, on one thread "
        "per replica: long inputs should skip it.",
    )
    refine_max_texts: int = Field(
        default=32, ge=1, description="refine_text: segments per call at most; more is 413 request_too_large."
    )
    refine_wait_s: float = Field(
        default=30.0,
        gt=0,
        description="refine_text: how long a call (each batch of its segments) may wait for the refiner, which "
        "runs one batch at a time in arrival order; past it, 503 refine_busy.",
    )
    cuda_graph_kv_tokens: int = Field(
        default=2048,
        ge=64,
        description="KV columns of the static buffers (cuda_graphs): a batch whose KV is longer steps "
        "eagerly. They take largest bucket x this x 2 x layers x hidden x dtype bytes of GPU memory "
        "(~61 KB per token and row for the full-size GPT in bfloat16), and attention reads all of them.",
    )

    @model_validator(mode="after")
    def _check_deadlines(self) -> "AcousticConfig":
        if self.resume_ahead_s >= self.park_ahead_s:
            raise ValueError("resume_ahead_s must be below park_ahead_s (the margin keeps rows from thrashing)")
        return self


class VocoderConfig(StrictModel):
    """Sliding-window decode (docs/architecture.md, "The sliding-window vocoder")."""

    left_context_tokens: int = Field(
        default=16, ge=0, description="cache_state False: already-emitted tokens each window decodes again."
    )
    # >= 1: the centred ISTFT of a window lacks the last half token (256 samples) of its end.
    hold_back_tokens: int = Field(default=HOLD_BACK_TOKENS, ge=1)
    min_window_tokens: int = Field(
        default=MIN_WINDOW_TOKENS,
        ge=1,
        description="A segment's first window, in tokens; the windows after it double up to window_tokens "
        "(8, 8, 16, 24, 24, ...). Windows end at token positions that depend on nothing but these two numbers, "
        "never on how the hidden states arrived: the same tokens give the same audio, bit for bit.",
    )
    window_tokens: int = Field(
        default=WINDOW_TOKENS, ge=1, description="Tokens per window once the ramp from min_window_tokens is done."
    )
    # Measured by `python -m bench vocoder` (bench/README.md): carried state + bfloat16 is 6.1x the
    # audio seconds per core of re-decoding the context in float32, 69.9 dB SNR from it.
    cache_state: bool = Field(
        default=True,
        description="Carry each convolution's last input frames from window to window (engine/vocoder_net.py) "
        "instead of decoding left_context_tokens again: a window decodes its new and held-back tokens only.",
    )
    precision: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="dtype of the Decoder's and Vocos's MLP matmuls (~95% of their FLOPs; the rest stays float32). "
        "auto: bfloat16 on CUDA and on CPUs with native bf16 dot products (avx512_bf16, AMX, Arm bf16), else "
        "float32 (emulated bf16 is slower). float32 with cache_state False is the ChatTTS modules themselves.",
    )
    device: Optional[Literal["auto", "cpu", "cuda"]] = Field(
        default=None,
        description="Where the vocoder runs; None: where its weights were loaded (model.device). auto: cuda if "
        "present, else cpu.",
    )


class SegmentConfig(StrictModel):
    """How long a segment's generation may run."""

    max_chars: int = Field(default=120, ge=8, description="Segment length cut by the splitter.")
    max_seconds: Optional[float] = Field(
        default=4.0,
        gt=0,
        description="Expected speech per segment at most (cut at sentence ends, then clauses; None: "
        "characters only). Shorter segments are more rows decoded in parallel: a long input's latency "
        "and the batch's width do not hinge on its longest sentence (bench/README.md).",
    )
    cap_factor: float = Field(default=3.0, gt=1, description="max_new_token = cap_factor * expected + cap_slack.")
    cap_slack: int = Field(default=64, ge=0)
    max_new_token: int = Field(default=2048, ge=16, description="Hard ceiling for any segment.")
    max_segments: int = Field(
        default=512,
        ge=1,
        description="Segments per request at most, after normalisation; more is 413 request_too_large. "
        "4096 characters of Chinese prose (ingress.max_input_chars) make ~215 segments of max_seconds 4.0, "
        "up to ~410 with short sentences (each its own segment); number-heavy text (numbers read out in "
        "full) and tag floods make more.",
    )
    max_request_seconds: float = Field(
        default=1800.0,
        gt=0,
        description="Expected seconds of speech per request at most (the segments' expected tokens, at the "
        "request's speed); more is 413 request_too_large. 4096 characters of Chinese prose are ~860 s at "
        "speed 1, English ~240 s: the cap is twice the longest prose and bites on slow speeds (speed 0.25 "
        "is 4x the seconds) and on number floods read out in full. Silence (SSML breaks, pauses between "
        "turns, a lead-in) counts too: it costs the same bytes and vocoder time as speech.",
    )
    max_silence_seconds: float = Field(
        default=480.0,
        ge=0,
        description="Silence per request at most, the whole script together (SSML breaks, pauses between "
        "dialogue turns, a lead-in); more is 413 request_too_large. One SSML document's breaks stop at 120 s, "
        "a 64-turn dialogue's pauses at 320 s: a dialogue's turns share this cap instead of each turn having "
        "its own.",
    )

    @model_validator(mode="after")
    def _check(self) -> "SegmentConfig":
        if self.cap_slack > self.max_new_token:
            raise ValueError("cap_slack must not exceed max_new_token")
        return self


def acoustic_heard_through(acoustic: AcousticConfig, vocoder: VocoderConfig) -> AcousticConfig:
    """``acoustic`` with what its listener model takes from this vocoder: the tokens it holds back
    (``listener_lag_tokens``) and the fewest new tokens it decodes (``min_early_chunk_tokens``)."""
    return acoustic.model_copy(
        update={"listener_lag_tokens": vocoder.hold_back_tokens, "min_early_chunk_tokens": vocoder.min_window_tokens}
    )


class EngineConfig(StrictModel):
    model: ModelConfig = ModelConfig()
    acoustic: AcousticConfig = AcousticConfig()
    vocoder: VocoderConfig = VocoderConfig()
    segments: SegmentConfig = SegmentConfig()
