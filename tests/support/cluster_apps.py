"""A second Serve application for the cluster tests: it reaches the ``chattts`` app only through
DeploymentHandles, as another team's Ray application would (README, "From another Ray
application"). Deployed next to it by tests/system/test_cluster.py (``import_path:
support.cluster_apps:caller``; the cluster's nodes have tests/ on their PYTHONPATH).
"""

from __future__ import annotations

import base64

from fastapi import FastAPI
from ray import serve

api = FastAPI()


@serve.deployment
@serve.ingress(api)
class Caller:
    @api.post("/synthesize")
    async def synthesize(self, body: dict) -> dict:
        """The whole file through ``synthesize``, then the same request streamed through ``stream``
        (both base64: the test compares the audio)."""
        handle = serve.get_app_handle("chattts")
        whole = await handle.synthesize.remote(body)
        pieces = [p async for p in handle.options(stream=True).stream.remote(body)]
        return {
            "whole": base64.b64encode(whole).decode(),
            "stream_pieces": len(pieces),
            "stream": base64.b64encode(b"".join(pieces)).decode(),
        }

    @api.get("/acoustic")
    async def acoustic(self) -> dict:
        """One Acoustic replica's stats (engine config and placement), through a deployment handle."""
        return await serve.get_deployment_handle("Acoustic", app_name="chattts").stats.remote()


caller = Caller.bind()
