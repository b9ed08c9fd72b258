"""The acoustic decode loop's parts (``serve_app.engine.acoustic`` runs them):

- ``streams``: a row's output stream (``RowStream``, ``HiddenChunk``);
- ``row``: one row's decode state (tokens, pending hidden states, chunk schedule);
- ``scheduler``: the waiting queue and admission (priority, aging, max rows, token budget);
- ``batch``: the running batch's KV buffers, mask and positions (merge, step, retire);
- ``sampling``: the batched sampling pass (heads, penalty, top-p/top-k, seeded draws per row);
- ``cuda_graph``: the decode step padded to a batch bucket over static buffers, replayed from
  CUDA graphs (``AcousticConfig.cuda_graphs``).
"""
