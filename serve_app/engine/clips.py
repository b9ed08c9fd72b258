"""Reference clips -> voices: decode an uploaded clip, check it, encode it as ChatTTS does.

ChatTTS 0.2 clones a voice zero-shot from a short clip and its transcript: the clip's audio codes
from the DVAE encoder (``Chat.sample_audio_speaker``: ``Speaker.encode_prompt`` of
``DVAE.sample_audio``) go into the prompt after the text (``spk_smp``), the transcript before it
(``txt_smp``). This module does the clip side, in the Vocoder stage (CPU, torch, PyAV already
there): the Acoustic stage keeps only the GPT, and the Ingress imports neither torch nor PyAV.

- ``decode_clip``: an audio file in a common container (wav, mp3, flac, ogg, m4a/mp4, webm/mka,
  aiff, caf, aac, amr, ...) -> float32 mono at 24 kHz, with its length and loudness checked
  (``InvalidClipError``). Clips come from users, so decoding is bounded whatever the file says:
  see ``decode_clip``.
- ``VoiceEncoder``: the DVAE encoder and quantiser (``load_voice_encoder`` builds them from the
  asset file ``Chat._load`` reads) and ChatTTS's speaker statistics, which turn a seed into the
  speaker string users can keep.
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from .audio import SAMPLE_RATE
from .errors import InvalidClipError
from .voices import speaker_from_seed

# Below this RMS (-50 dBFS) a clip is silence or hum: nothing for the encoder to copy.
SILENCE_RMS = 10 ** (-50 / 20)

# What a clip may declare and what decoding it may cost (``decode_clip``). A clip is resampled
# to 24 kHz, so a low rate multiplies what it decodes to (a 10 Hz frame of 4089 samples is 9.8M
# samples at 24 kHz): rates below telephone audio's are refused, as are more channels than 7.1.
MIN_RATE = 8000
MAX_RATE = 192000
MAX_CHANNELS = 8
# Decoding goes through at most this much audio a second of clip, summed over channels at the
# source rate (8 channels at 48 kHz, or 2 at 192 kHz): it bounds the decoding work, never what
# is held (each frame is averaged to mono at 24 kHz as it comes).
MAX_SOURCE_VALUES_PER_SECOND = 8 * 48000
# Packets (and frames) a second of clip: Opus's shortest frame is 2.5 ms (400 a second), Vorbis's
# short blocks at 48 kHz 2.7 ms; a file cut finer is refused before its per-packet cost (demuxing,
# decoding and resampling: 20-50 us each in PyAV) adds up (15,250 packets for a 30 s limit).
MAX_PACKETS_PER_SECOND = 500
# A declared duration is an estimate for some files (an MP3 without a Xing header: from its
# first frames' bitrate), so only one over twice the limit is refused before decoding; the
# decoded length is the exact check.
DECLARED_SECONDS_FACTOR = 2.0
# Containers a clip may come in (ffmpeg demuxer names; "mov" covers mp4/m4a/3gp, "matroska"
# webm/mka). Nothing else is probed: ffmpeg's meta-formats (concat scripts, HLS and DASH
# playlists, ...) open other files, e.g. a concat script naming a file beside the replica.
CLIP_CONTAINERS = (
    "wav",
    "w64",
    "aiff",
    "caf",
    "flac",
    "mp3",
    "ogg",
    "mov",
    "matroska",
    "aac",
    "amr",
    "amrnb",
    "amrwb",
    "wv",
    "ape",
    "au",
    "asf",
    "ac3",
    "eac3",
    "tta",
)
_CONTAINER_OPTIONS = {
    "format_whitelist": ",".join(CLIP_CONTAINERS),
    "protocol_whitelist": "none",  # no file, no network: only the uploaded bytes are read
    "max_streams": "16",  # a file of thousands of streams is cut short (ffmpeg's default: 1000)
}


@dataclass(frozen=True)
class ClipLimits:
    min_seconds: float = 2.0
    max_seconds: float = 30.0


def _declared_problem(stream: Any, container: Any, limits: ClipLimits) -> Optional[str]:
    """What is wrong with the stream's declared parameters, before anything is decoded."""
    ctx = stream.codec_context
    if ctx is None or ctx.codec is None or ctx.codec.type != "audio":
        return "the clip's audio has no decoder here"
    if not 1 <= ctx.channels <= MAX_CHANNELS:
        return f"the clip has {ctx.channels} channels; send 1-{MAX_CHANNELS}"
    if not MIN_RATE <= ctx.sample_rate <= MAX_RATE:
        return f"the clip is sampled at {ctx.sample_rate} Hz; send {MIN_RATE}-{MAX_RATE} Hz"
    declared = None
    if stream.duration is not None and stream.time_base is not None:
        declared = float(stream.duration * stream.time_base)
    elif container.duration is not None:
        declared = container.duration / 1e6  # AV_TIME_BASE
    if declared is not None and declared > DECLARED_SECONDS_FACTOR * limits.max_seconds:
        return f"the clip is longer than {limits.max_seconds:g} s (it says {declared:.0f} s)"
    return None


def _channels(frame: Any) -> int:
    return len(frame.layout.channels)  # the same in every PyAV the project allows (12-19)


def _frame_problem(frame: Any) -> Optional[str]:
    """A decoded frame's rate and channels, checked before it is resampled (a codec may change
    them mid-stream, whatever the header said)."""
    if not MIN_RATE <= frame.sample_rate <= MAX_RATE:
        return f"the clip changes to {frame.sample_rate} Hz; send {MIN_RATE}-{MAX_RATE} Hz"
    if not 1 <= _channels(frame) <= MAX_CHANNELS:
        return f"the clip changes to {_channels(frame)} channels; send 1-{MAX_CHANNELS}"
    return None


def _mono(frame: Any) -> np.ndarray:
    """An interleaved float frame's channels averaged (float32)."""
    return frame.to_ndarray().reshape(-1, _channels(frame)).mean(axis=1)


def decode_clip(data: bytes, limits: ClipLimits = ClipLimits()) -> np.ndarray:
    """The clip's first audio stream as float32 mono PCM at 24 kHz; ``InvalidClipError`` when it
    is not audio, shorter or longer than ``limits``, or silent.

    Bounded whatever the file holds or says: only ``CLIP_CONTAINERS`` are opened (no other file
    and no network), the stream's rate, channels and declared duration are checked before
    decoding, and each decoded frame's rate, channels and length before it is resampled (a frame
    that would take the clip past the limit ends decoding: "longer than"). Decoding goes through
    at most ``MAX_SOURCE_VALUES_PER_SECOND`` and ``MAX_PACKETS_PER_SECOND`` per second of the
    limit, and holds the clip at 24 kHz mono plus one frame: about (max_seconds + 0.5) x 24000 x
    4 bytes, a few times over (2.9 MB for 30 s)."""
    import av

    if not data:
        raise InvalidClipError("the audio file is empty")
    parts: list[np.ndarray] = []
    samples = 0
    cap_seconds = limits.max_seconds + 0.5
    cap = int(cap_seconds * SAMPLE_RATE)
    max_values = int(cap_seconds * MAX_SOURCE_VALUES_PER_SECOND)
    max_packets = int(cap_seconds * MAX_PACKETS_PER_SECOND)
    decoded = 0.0  # seconds decoded so far, at the source rate
    values = packets = frames = 0
    too_long = False
    try:
        container = av.open(io.BytesIO(data), mode="r", container_options=_CONTAINER_OPTIONS)
    except (av.FFmpegError, ValueError, EOFError, MemoryError) as exc:
        raise InvalidClipError(
            f"could not decode the audio: {exc.__class__.__name__} (send an audio file: "
            "wav, mp3, flac, ogg, m4a, webm, aiff, caf, aac, amr, ...)"
        ) from None
    try:
        with container:
            if not container.streams.audio:
                raise InvalidClipError("the file holds no audio stream")
            stream = container.streams.audio[0]
            problem = _declared_problem(stream, container, limits)
            if problem:
                raise InvalidClipError(problem)
            discard_all = getattr(getattr(av.stream, "Discard", None), "all", None)  # PyAV >= 14
            for other in container.streams:
                if other is not stream and discard_all is not None:
                    other.discard = discard_all  # the demuxer skips their packets itself
            # Interleaved float at 24 kHz in the clip's own layout; channels are averaged below
            # (ffmpeg's mono downmix adds them up at +3 dB and could clip). Not planar: PyAV's
            # to_ndarray of a planar frame of 8 channels or more crashes the process.
            resampler = av.AudioResampler(format="flt", rate=SAMPLE_RATE)
            for packet in container.demux(stream):  # the last one (empty) flushes the decoder
                packets += 1
                if packets > max_packets:
                    raise InvalidClipError(f"the file is cut into more than {max_packets} packets")
                for frame in packet.decode():
                    frames += 1
                    if frames > max_packets:
                        raise InvalidClipError(f"the file is cut into more than {max_packets} frames")
                    problem = _frame_problem(frame)
                    if problem:
                        raise InvalidClipError(problem)
                    frame_seconds = frame.samples / frame.sample_rate
                    if decoded + frame_seconds > cap_seconds:
                        too_long = True
                        break
                    values += frame.samples * _channels(frame)
                    if values > max_values:
                        raise InvalidClipError(
                            f"the clip holds too much audio data ({_channels(frame)} channels at "
                            f"{frame.sample_rate} Hz); send mono or stereo"
                        )
                    decoded += frame_seconds
                    for out in resampler.resample(frame):
                        parts.append(_mono(out))
                        samples += out.samples
                if too_long:
                    break
            else:
                for out in resampler.resample(None):
                    parts.append(_mono(out))
                    samples += out.samples
    except InvalidClipError:
        raise
    except (av.FFmpegError, ValueError, EOFError, MemoryError) as exc:
        raise InvalidClipError(f"could not decode the audio: {exc.__class__.__name__}") from None
    if too_long or samples > cap:
        raise InvalidClipError(
            f"the clip is longer than {limits.max_seconds:g} s; send {limits.min_seconds:g}-{limits.max_seconds:g} s"
        )
    seconds = samples / SAMPLE_RATE
    if seconds < limits.min_seconds:
        raise InvalidClipError(
            f"the clip is {seconds:.1f} s; send {limits.min_seconds:g}-{limits.max_seconds:g} s of speech"
        )
    pcm = np.concatenate(parts).astype(np.float32, copy=False)
    if not np.isfinite(pcm).all():
        raise InvalidClipError("the clip holds non-finite samples")
    if float(np.sqrt(np.mean(np.square(pcm, dtype=np.float64)))) < SILENCE_RMS:
        raise InvalidClipError("the clip is silent (below -50 dBFS)")
    return pcm


@dataclass(frozen=True)
class EncodedClip:
    spk_smp: str  # ChatTTS's prompt string of the clip's audio codes
    seconds: float
    frames: int  # prompt positions the clip adds to every row that uses it


class VoiceEncoder:
    """ChatTTS's DVAE encoder (``dvae``, a ``ChatTTS.model.DVAE`` with its encoder and quantiser)
    and speaker statistics (``speaker``, a ``ChatTTS.model.Speaker``).

    With ``dvae`` None, ``build`` makes it at the first clip (``load_voice_encoder``), on the
    thread that encodes."""

    def __init__(self, dvae: Any, speaker: Any, build: Optional[Callable[[], Any]] = None):
        if dvae is None and build is None:
            raise ValueError("VoiceEncoder needs a DVAE or a function that builds one")
        self._dvae = dvae
        self._build = build
        self._lock = threading.Lock()
        self.speaker = speaker

    @property
    def dvae(self) -> Any:
        if self._dvae is None:
            with self._lock:
                if self._dvae is None:
                    self._dvae = self._build()
                    self._build = None
        return self._dvae

    @property
    def dvae_loaded(self) -> bool:
        return self._dvae is not None

    def encode(self, pcm: np.ndarray) -> EncodedClip:
        """What ``Chat.sample_audio_speaker(pcm)`` returns, for 24 kHz mono float32 PCM."""
        codes = self.dvae.sample_audio(np.ascontiguousarray(pcm, dtype=np.float32))
        return EncodedClip(self.speaker.encode_prompt(codes), len(pcm) / SAMPLE_RATE, int(codes.shape[1]))

    def encode_file(self, data: bytes, limits: ClipLimits = ClipLimits()) -> EncodedClip:
        return self.encode(decode_clip(data, limits))

    def speaker_for_seed(self, seed: int) -> str:
        """The speaker string of ``seed:<n>`` (what the Acoustic stage's ``SpeakerSampler`` samples)."""
        return speaker_from_seed(self.speaker, seed)


def load_voice_encoder(cfg: Any, lazy: bool = True) -> VoiceEncoder:
    """The speaker statistics from ChatTTS's config now, and the DVAE (encoder + quantiser) built
    as ``Chat._load`` builds it, from the same ``DVAE.safetensors``: at the first clip with
    ``lazy`` (the default), now without. ``cfg`` is a ``ModelConfig``; the DVAE runs where its
    device says (the Vocoder stage: CPU float32).

    Why lazy: the quantiser imports vector_quantize_pytorch, einx and with them ``torch._dynamo``
    and triton; with the encoder that is ~180 MiB of the Vocoder replica's RSS for voices made
    from clips, which are rare. The first clip pays it instead: ~2 s more, once per replica."""
    from .quiet import quiet_libraries
    from .weights.chattts import _fresh_chattts_config, chattts_modules
    from .weights.loading import select_device
    from .weights.sources import resolve_weights

    (speaker_module,) = chattts_modules("model.speaker")  # not the GPT, nor the DVAE
    quiet_libraries()
    weights = resolve_weights(cfg.weights)
    device = select_device(cfg.device)
    config = _fresh_chattts_config(weights.overrides)
    speaker = speaker_module.Speaker(config.gpt.hidden_size, config.spk_stat, device)

    def build() -> Any:
        from dataclasses import asdict

        import torch

        (dvae_module,) = chattts_modules("model.dvae")
        with torch.no_grad():
            dvae = dvae_module.DVAE(
                decoder_config=asdict(config.dvae.decoder),
                encoder_config=asdict(config.dvae.encoder),
                vq_config=asdict(config.dvae.vq),
                dim=config.dvae.decoder.idim,
                device=device,
            )
            dvae.load_pretrained(weights.asset_paths["dvae_ckpt_path"], device)
            # Encoding never runs the DVAE's decoder half: free it.
            del dvae.decoder, dvae.out_conv
        return dvae.eval()

    return VoiceEncoder(None, speaker, build) if lazy else VoiceEncoder(build(), speaker)
