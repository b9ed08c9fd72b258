"""The Ray layer: everything that runs on Ray and Serve, above what it builds.

The stages (``normalizer``, ``acoustic``, ``vocoder``, ``ingress``) and the builder ``serve run``
names (``app.build_app``); autoscaling on queue length, the stream slots and the job runner (Ray
actors); the proxy's hooks (``proxy/``: front guard, flow acknowledgements, edge cache, front
door); bulk synthesis on Ray Data (``bulk/``); the KubeRay manifest generator. Below it nothing
imports Ray: importing this package installs what the layers below get from Ray (metrics and
back-pressure boards, ``backends.py``) in every process that runs any of it.
"""

from .backends import install

install()
