"""Bulk synthesis on Ray Data: ``chattts-serve batch INPUT --out DIR``.

One row of JSONL, CSV or Parquet (``id``, ``text``, the options of a request) becomes one audio
file, a line of the manifest, or a line of the errors file. The stages:

- read and plan (CPU tasks, ``rows.py``): each row validated (``config.BatchRow``) and planned
  by the engine's ``Planner``: normalised text, segments, voice, seeds;
- decode (an actor pool, ``stages.AcousticStage``): each actor loads the GPT once and decodes the
  segments of many rows in one continuously batched ``AcousticEngine``;
- vocode and encode (CPU actors, ``stages.VocodeStage``): the engine's ``Vocoder`` and encoders;
- write (the driver, ``output.py``): each row's file under a temporary name, renamed when whole,
  then committed to a journal; the Parquet manifest is merged from the journal at the end.

A rerun into the same ``--out`` skips the rows the journal commits whose files are there
(``job.py``). Ray is imported here only: the engine underneath stays plain Python.
"""
