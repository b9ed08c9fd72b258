"""Bulk synthesis on Ray Data: ``chattts-serve batch INPUT --out DIR``.

One row of JSONL, CSV or Parquet (``id``, ``text``, the options of a request) becomes one audio
file, a line of the manifest, or a line of the errors file. The stages:

- read and check (the driver, ``rows.py``): each row validated (``config.BatchRow``) and its id
  checked against the others';
- speak (an actor pool, ``speech.SpeechStage``): each actor loads the model once and speaks many
  rows at once through the speech pipeline every front door uses (``serve_app.pipeline``, in one
  process): plan, a continuously batched ``AcousticEngine``, the vocoder and the encoders;
- write (the driver, ``output.py``): each row's file under a temporary name, renamed when whole,
  then committed to a journal; the Parquet manifest is merged from the journal at the end.

A rerun into the same ``--out`` skips the rows the journal commits whose files are there
(``job.py``). Ray is imported here only: the engine and the pipeline underneath stay plain Python.
"""
