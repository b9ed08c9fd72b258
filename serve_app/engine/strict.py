"""The one base class of the project's config and request models: an unknown field is an error.

It lives in the engine, the lowest layer (pydantic only), so the engine's configs, the API's
request models (``protocol/``) and the serving layer's settings (``settings/``) share it without
an upward import. A class that also wants ``frozen=True`` adds its own ``model_config``; pydantic
merges it with this one.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A pydantic model that refuses fields it does not declare (a typo fails, it is not ignored)."""

    model_config = ConfigDict(extra="forbid")
