"""The HTTP API's routers, one module per feature: each route reads who is calling (the guard
middleware identified it) and calls its feature's service, found in the app's state
(``state.py``). The Ingress attaches each router with one line (``app.include_router``)."""
