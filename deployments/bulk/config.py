"""What a bulk synthesis job is given: its options (``BatchConfig``) and one input row
(``BatchRow``), validated with pydantic like the service's requests.

No Ray and no torch here: the driver imports this module before it starts Ray.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, field_validator

from serve_app.engine.audio import AudioFormat
from serve_app.engine.config import (
    AcousticConfig,
    Device,
    DType,
    EngineConfig,
    ModelConfig,
    SegmentConfig,
    VocoderConfig,
    WeightsConfig,
)
from serve_app.engine.strict import StrictModel
from serve_app.engine.styles import MAX_INSTRUCTIONS_CHARS
from serve_app.engine.types import SynthesisOptions
from serve_app.protocol import SpeechRequest
from serve_app.settings import IngressConfig

InputFormat = Literal["jsonl", "csv", "parquet"]
INPUT_SUFFIXES: dict[str, InputFormat] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
MAX_ID_CHARS = 256
# A row is one request's worth of text: the service's own input limit.
MAX_TEXT_CHARS = IngressConfig.model_fields["max_input_chars"].default
# One chunk per segment: nobody listens while a batch decodes, and a chunk is an object to hand
# on. Above any segment's tokens.
WHOLE_SEGMENT_TOKENS = 1 << 16
# Calls an actor runs at once: its next call's rows join the decode while the last rows of the
# one before finish, so the batch does not thin out between calls.
CALLS_PER_ACTOR = 2


class BatchRow(SynthesisOptions):
    """One input row: its ``id``, the ``text`` (plain, or SSML as the API reads it), the file's
    ``response_format``, ``instructions`` and the options a request may set
    (``SynthesisOptions``). Each row is prepared as the API prepares a request
    (``pipeline/prepare.py``); ``voice`` is a built-in name, ``seed:<n>`` or a ChatTTS speaker
    string: voices stored by a running service are not read here (a stored voice's name is
    ``voice_not_found``)."""

    id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    text: str = Field(max_length=MAX_TEXT_CHARS)
    response_format: AudioFormat = "wav"
    instructions: Optional[str] = Field(default=None, max_length=MAX_INSTRUCTIONS_CHARS)
    input_format: Optional[Literal["text", "ssml"]] = None

    @field_validator("id", mode="before")
    @classmethod
    def _id(cls, v: Any) -> Any:
        return row_id({"id": v}) if isinstance(v, int) else v

    @field_validator("id")
    @classmethod
    def _id_printable(cls, v: str) -> str:
        if not v.strip() or not v.isprintable():
            raise ValueError("id must be non-empty printable text")
        return v

    @field_validator("text")
    @classmethod
    def _text(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("text is empty")
        return v

    def request(self) -> SpeechRequest:
        """The row as the API's speech request: what every door prepares."""
        fields = self.model_dump(include=set(SynthesisOptions.model_fields) | {"instructions", "input_format"})
        return SpeechRequest.model_validate({**fields, "input": self.text, "response_format": self.response_format})


ROW_FIELDS = frozenset(BatchRow.model_fields)


def row_id(raw: Any) -> Optional[str]:
    """A row's id as text (JSON and Parquet ids may be integers), or None where it has none."""
    v = raw.get("id") if isinstance(raw, dict) else None
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return str(v)
    return v if isinstance(v, str) else None


class BatchConfig(StrictModel):
    """One run of ``chattts-serve batch``: input, output, cluster, model and the actors' sizes."""

    input: str = Field(description="JSONL, CSV or Parquet file(s): a path, directory or glob Ray Data reads.")
    out: str = Field(description="Output directory on the driver's machine: audio/, manifest.parquet, errors.jsonl.")
    input_format: Optional[InputFormat] = Field(default=None, description="None: from the input's suffix.")
    default_format: AudioFormat = Field(default="wav", description="response_format of rows that set none.")
    address: Optional[str] = Field(
        default=None,
        description="Ray cluster to join ('auto', 'ray://...'); None: RAY_ADDRESS if set (ray job "
        "submit sets it), else a new local Ray for this run.",
    )
    num_cpus: Optional[float] = Field(default=None, gt=0, description="CPUs of the local Ray (None: all cores).")
    # Model: the service's weights sources (CHATTTS_WEIGHTS overrides, as there).
    weights: WeightsConfig = WeightsConfig()
    device: Device = "auto"
    dtype: Optional[DType] = Field(default=None, description="GPT dtype; None: bfloat16 on a GPU, float32 on CPU.")
    quantize: Literal["auto", "none", "int8"] = Field(
        default="auto", description="As model.quantize: auto is int8 on CPU (float32), none on a GPU."
    )
    # The speech actors: each runs the whole speech pipeline (plan, decode, vocode, encode).
    actors: Optional[int] = Field(
        default=None, ge=1, description="None: one per num_gpus share of every GPU, else one per node with CPUs."
    )
    num_gpus: Optional[float] = Field(
        default=None,
        ge=0,
        le=1,
        description="GPU share per actor; None: 0.5 where the cluster has GPUs "
        "and device is auto or cuda (two actors per GPU, as config/serve.gpu.yaml), else 0.",
    )
    actor_cpus: Optional[float] = Field(
        default=None,
        gt=0,
        description="Ray CPUs per actor; None: 1 on a GPU, else the smallest node's CPUs less a read task's.",
    )
    actor_threads: Optional[int] = Field(
        default=None, ge=1, description="torch threads of an actor's decode (None: its CPUs, rounded, at least 1)."
    )
    max_rows: Optional[int] = Field(
        default=None,
        ge=1,
        description="Segments an actor decodes together at most; None: 64 on a GPU, 16 on CPU (the service's default).",
    )
    rows_per_call: Optional[int] = Field(
        default=None,
        ge=1,
        description="Input rows one actor call speaks at once (None: max_rows); an actor takes "
        f"{CALLS_PER_ACTOR} calls at a time, so its batches stay full while a call's last rows finish.",
    )
    read_cpus: float = Field(default=0.25, gt=0, description="Ray CPUs per read task.")
    segments: SegmentConfig = SegmentConfig()
    vocoder: VocoderConfig = VocoderConfig()

    def decode_rows(self, gpu: bool) -> int:
        return self.max_rows or (64 if gpu else 16)

    def call_rows(self, gpu: bool) -> int:
        return self.rows_per_call or self.decode_rows(gpu)

    def engine_config(self, weights: WeightsConfig, gpu: bool, cpus: float) -> EngineConfig:
        """What each actor's ``LocalPipeline`` runs: the model on the actor's device (the vocoder
        with it), and a decode loop for whole rows: one client (every slot), nothing parks (the
        actor collects whole rows), a queue that holds its calls' rows, one chunk per segment."""
        dtype = self.dtype or ("bfloat16" if gpu else "float32")
        device = ("cuda" if gpu else "cpu") if self.device == "auto" else self.device
        threads = self.actor_threads or max(1, round(cpus))
        model = ModelConfig(weights=weights, device=device, dtype=dtype, quantize=self.quantize, torch_threads=threads)
        rows = self.decode_rows(gpu)
        queued = max(
            AcousticConfig().max_queued_rows, CALLS_PER_ACTOR * self.call_rows(gpu) * self.segments.max_segments
        )
        acoustic = AcousticConfig(
            max_rows=rows,
            token_budget=max(AcousticConfig().token_budget, 1024 * rows),
            first_chunk_tokens=WHOLE_SEGMENT_TOKENS,
            chunk_tokens=WHOLE_SEGMENT_TOKENS,
            listener_margin_s=None,
            max_stream_chunks=None,
            max_queued_rows=queued,
            max_queued_rows_per_client=queued,
            max_running_rows_per_client=None,
            reserved_rows=0,
        )
        return EngineConfig(model=model, acoustic=acoustic, vocoder=self.vocoder, segments=self.segments)
