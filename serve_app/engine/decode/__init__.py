"""The acoustic decode loop's parts (``serve_app.engine.acoustic`` runs them):

- ``streams``: a row's output stream (``RowStream``, ``HiddenChunk``);
- ``row``: one row's decode state (tokens, pending hidden states, chunk schedule);
- ``scheduler``: the waiting queue and the fair admission between clients (priority, aging, max
  rows, token budget);
- ``deadline``: the deadline rule: real-time rows least slack first, parking rows far ahead of
  their listeners, the rest for rows without one (``decide``);
- ``playback``: a request's playback clock: each row's slack, its listener's stalls (``Playback``);
- ``capacity``: the decode step's time against rows, measured online (``StepModel``);
- ``prefill``: a new row's prompt in ChatTTS's format, run through the GPT alone (``Prefiller``);
- ``batch``: the running batch's KV buffers, mask and positions (merge, step, retire);
- ``forward``: the decode step's GPT forward written out (``DecodeForward``);
- ``sampling``: the batched sampling pass (heads, penalty, top-p/top-k, seeded draws per row);
- ``parking``: rows out of the batch with their KV, while their consumers catch up or set aside by
  the deadline rule (``ParkedRows``);
- ``stats``: what the loop counts (``EngineStats``);
- ``cuda_graph``: the decode step padded to a batch bucket over static buffers, replayed from
  CUDA graphs (``AcousticConfig.cuda_graphs``).
"""
