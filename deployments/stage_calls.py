"""How the stages of one application call each other (``args.flow.transport``).

Serve's default sends a handle call as a Ray actor task, its result and each streamed item
through the object store: ~8-10 ms a hop on a 2-core box, three hops before the first audio
(TextNormalizer, Ingress -> Vocoder, Vocoder -> Acoustic). ``grpc`` sends the call straight to the
replica's gRPC server with the items pickled inline (what Serve's throughput-optimized mode
does), a few ms less a hop; bench/README.md has the A/B. Calls whose arguments can pass gRPC's
4 MiB limit (a voice clip upload) keep the object store: their callers use the handle as given."""

from __future__ import annotations

from ray.serve.handle import DeploymentHandle

from serve_app.settings import FlowConfig


def stage_handle(handle: DeploymentHandle, flow: FlowConfig) -> DeploymentHandle:
    """``handle`` as the speech path calls it under ``flow.transport``."""
    if flow.transport == "object_store":
        return handle
    return handle.options(_by_reference=False)
