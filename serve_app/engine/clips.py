"""Reference clips -> voices: decode an uploaded clip, check it, encode it as ChatTTS does.

ChatTTS 0.2 clones a voice zero-shot from a short clip and its transcript: the clip's audio codes
from the DVAE encoder (``Chat.sample_audio_speaker``: ``Speaker.encode_prompt`` of
``DVAE.sample_audio``) go into the prompt after the text (``spk_smp``), the transcript before it
(``txt_smp``). This module does the clip side, in the Vocoder stage (CPU, torch, PyAV already
there): the Acoustic stage keeps only the GPT, and the Ingress imports neither torch nor PyAV.

- ``decode_clip``: any container/codec ffmpeg reads (wav, mp3, flac, ogg, m4a, webm, ...) ->
  float32 mono at 24 kHz, with its length and loudness checked (``InvalidClipError``).
- ``VoiceEncoder``: the DVAE encoder and quantiser (``load_voice_encoder`` builds them from the
  asset file ``Chat._load`` reads) and ChatTTS's speaker statistics, which turn a seed into the
  speaker string users can keep.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from .audio import SAMPLE_RATE
from .errors import InvalidClipError
from .voices import speaker_from_seed

# Below this RMS (-50 dBFS) a clip is silence or hum: nothing for the encoder to copy.
SILENCE_RMS = 10 ** (-50 / 20)


@dataclass(frozen=True)
class ClipLimits:
    min_seconds: float = 2.0
    max_seconds: float = 30.0


def decode_clip(data: bytes, limits: ClipLimits = ClipLimits()) -> np.ndarray:
    """The clip's first audio stream as float32 mono PCM at 24 kHz; ``InvalidClipError`` when it
    is not audio, shorter or longer than ``limits``, or silent. Decoding stops as soon as the
    clip is known to be too long, so a long file costs no more than the limit."""
    import av

    if not data:
        raise InvalidClipError("the audio file is empty")
    parts: list[np.ndarray] = []
    samples = 0
    cap = int((limits.max_seconds + 0.5) * SAMPLE_RATE)
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise InvalidClipError("the file holds no audio stream")
            stream = container.streams.audio[0]
            # Planar float at 24 kHz in the clip's own layout; channels are averaged below
            # (ffmpeg's mono downmix adds them up at +3 dB and could clip).
            resampler = av.AudioResampler(format="fltp", rate=SAMPLE_RATE)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    parts.append(out.to_ndarray().mean(axis=0))
                    samples += out.samples
                if samples > cap:
                    break
            else:
                for out in resampler.resample(None):
                    parts.append(out.to_ndarray().mean(axis=0))
                    samples += out.samples
    except InvalidClipError:
        raise
    except (av.FFmpegError, ValueError, EOFError) as exc:
        raise InvalidClipError(f"could not decode the audio: {exc.__class__.__name__}") from None
    seconds = samples / SAMPLE_RATE
    if samples > cap:
        raise InvalidClipError(f"the clip is longer than {limits.max_seconds:g} s; send {limits.min_seconds:g}-{limits.max_seconds:g} s")
    if seconds < limits.min_seconds:
        raise InvalidClipError(f"the clip is {seconds:.1f} s; send {limits.min_seconds:g}-{limits.max_seconds:g} s of speech")
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
    and speaker statistics (``speaker``, a ``ChatTTS.model.Speaker``)."""

    def __init__(self, dvae: Any, speaker: Any):
        self.dvae = dvae
        self.speaker = speaker

    def encode(self, pcm: np.ndarray) -> EncodedClip:
        """What ``Chat.sample_audio_speaker(pcm)`` returns, for 24 kHz mono float32 PCM."""
        codes = self.dvae.sample_audio(np.ascontiguousarray(pcm, dtype=np.float32))
        return EncodedClip(self.speaker.encode_prompt(codes), len(pcm) / SAMPLE_RATE, int(codes.shape[1]))

    def encode_file(self, data: bytes, limits: ClipLimits = ClipLimits()) -> EncodedClip:
        return self.encode(decode_clip(data, limits))

    def speaker_for_seed(self, seed: int) -> str:
        """The speaker string of ``seed:<n>`` (what the Acoustic stage's ``SpeakerSampler`` samples)."""
        return speaker_from_seed(self.speaker, seed)


def load_voice_encoder(cfg: Any) -> VoiceEncoder:
    """Build the DVAE (encoder + quantiser) as ``Chat._load`` builds it, from the same
    ``DVAE.safetensors``, and the speaker statistics from ChatTTS's config. ``cfg`` is a
    ``ModelConfig``; the DVAE runs where its device says (the Vocoder stage: CPU float32)."""
    from dataclasses import asdict

    import torch
    from ChatTTS.model import DVAE, Speaker

    from .quiet import quiet_libraries
    from .weights import _fresh_chattts_config, resolve_weights, select_device

    quiet_libraries()
    weights = resolve_weights(cfg.weights)
    device = select_device(cfg.device)
    config = _fresh_chattts_config(weights.overrides)
    with torch.no_grad():
        dvae = DVAE(
            decoder_config=asdict(config.dvae.decoder),
            encoder_config=asdict(config.dvae.encoder),
            vq_config=asdict(config.dvae.vq),
            dim=config.dvae.decoder.idim,
            device=device,
        )
        dvae.load_pretrained(weights.asset_paths["dvae_ckpt_path"], device)
        # Encoding never runs the DVAE's decoder half: free it.
        del dvae.decoder, dvae.out_conv
    speaker = Speaker(config.gpt.hidden_size, config.spk_stat, device)
    return VoiceEncoder(dvae.eval(), speaker)
