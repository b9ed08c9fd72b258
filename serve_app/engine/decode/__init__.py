"""The acoustic decode loop's parts (``serve_app.engine.acoustic`` runs them):

- ``streams``: a row's output stream (``RowStream``, ``HiddenChunk``);
- ``row``: one row's decode state (tokens, pending hidden states, chunk schedule);
- ``scheduler``: the waiting queue and admission (priority, aging, max rows, token budget);
- ``prefill``: a new row's prompt in ChatTTS's format, run through the GPT alone (``Prefiller``);
- ``batch``: the running batch's KV buffers, mask and positions (merge, step, retire);
- ``forward``: the decode step's GPT forward written out (``DecodeForward``);
- ``sampling``: the batched sampling pass (heads, penalty, top-p/top-k, seeded draws per row);
- ``parking``: rows out of the batch while their consumers catch up (``ParkedRows``);
- ``stats``: what the loop counts (``EngineStats``);
- ``cuda_graph``: the decode step padded to a batch bucket over static buffers, replayed from
  CUDA graphs (``AcousticConfig.cuda_graphs``).
"""
