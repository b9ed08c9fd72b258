"""The shipped configs expose nothing by default (config/serve.yaml binds loopback,
config/serve.gpu.yaml requires API keys), and key authentication fails closed: ``auth: required``
without a key loaded refuses to start."""

from __future__ import annotations

import pytest
from support.configs import chattts_app, load

from serve_app.http.security import APIKeyAuth, key_id
from serve_app.settings import AppConfig, SecurityConfig

UNSET = "CHATTTS_TEST_KEYS_NEVER_SET"
REFUSED = "security.auth is 'required' but no API key was loaded"


def chattts_args(cfg: dict) -> dict:
    return chattts_app(cfg).get("args") or {}


def test_default_config_listens_on_loopback_only():
    cfg = load("cpu")
    assert cfg["http_options"]["host"] == "127.0.0.1"
    # optional (the default) is fine there: nothing beyond this machine reaches it.
    assert AppConfig.model_validate(chattts_args(cfg)).ingress.security.auth == "optional"


def test_gpu_config_requires_keys():
    """The config meant for clusters listens on every interface, so it fails closed."""
    cfg = load("gpu")
    assert cfg["http_options"]["host"] == "0.0.0.0"
    security = AppConfig.model_validate(chattts_args(cfg)).ingress.security
    assert security.auth == "required" and security.api_keys_env == "CHATTTS_API_KEYS"


def test_required_auth_without_a_key_refuses(monkeypatch, tmp_path):
    """Every way a pod ends up with no key (the variable missing, empty or only separators, an
    empty keys file) is a refusal to start, never a replica without auth."""
    monkeypatch.delenv(UNSET, raising=False)
    with pytest.raises(RuntimeError, match=REFUSED):
        APIKeyAuth(SecurityConfig(auth="required", api_keys_env=UNSET))
    for value in ("", " , ,"):
        monkeypatch.setenv(UNSET, value)
        with pytest.raises(RuntimeError, match=REFUSED):
            APIKeyAuth(SecurityConfig(auth="required", api_keys_env=UNSET))
    keys_file = tmp_path / "keys"
    keys_file.write_text("# no key yet\n\n")
    with pytest.raises(RuntimeError, match=REFUSED):
        APIKeyAuth(SecurityConfig(auth="required", api_keys_env=None, api_keys_file=str(keys_file)))
    with pytest.raises(RuntimeError, match="nowhere"):
        APIKeyAuth(SecurityConfig(auth="required", api_keys_env=None))
    # With a key it starts, and only that key gets in.
    keys_file.write_text("# ops\nsk-from-the-file\n")
    auth = APIKeyAuth(SecurityConfig(auth="required", api_keys_env=UNSET, api_keys_file=str(keys_file)))
    assert auth.enabled and auth.identify("Bearer sk-from-the-file", "10.0.0.1").id == key_id("sk-from-the-file")
    # optional without keys: open, every caller anonymous (what config/serve.yaml on loopback does).
    monkeypatch.delenv(UNSET)
    assert not APIKeyAuth(SecurityConfig(auth="optional", api_keys_env=UNSET)).enabled
