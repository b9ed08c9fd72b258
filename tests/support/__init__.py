"""What the tests share: fixtures (registered by tests/conftest.py as plugins) and helpers.

Test modules import helpers from here and never from each other. Modules by what they serve:
``engine`` (the random-tiny model, segment requests, expected audio lengths), ``app`` (the one
Ray Serve app of the session), ``serve_run`` (``serve run`` as a user starts it), ``configs``
(the shipped Serve configs, and the GPU one for the local cluster), ``audio`` and ``http``
(responses), ``ws`` (WebSocket sessions), ``clips`` (reference clips), ``redis_server``,
``waiting``, ``report`` (measurements in the summary), ``cluster_apps`` (the second application of
the cluster tests, imported by Ray), ``step_load`` (their load that changes while it runs).
Processes, ports, clusters, waits and running apps are bench/lib's (``procs``, ``cluster``,
``waiting``, ``serve``), shared with the bench.
"""
