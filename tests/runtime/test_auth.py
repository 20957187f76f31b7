"""grpojob.auth: the token file, the bearer check, which paths it protects, and the refusal log."""
from __future__ import annotations

import logging
import stat

import pytest

from grpojob import auth
from grpojob.auth import ENV_METRICS_AUTH, ENV_TOKEN_FILE, Auth, TokenError


def test_a_local_token_file_is_made_once_with_mode_0600_and_kept(tmp_path):
    path = auth.ensure_file(tmp_path / "token")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = auth.read_file(path)
    assert len(token) >= 40  # 32 random bytes, url-safe base64
    assert auth.read_file(auth.ensure_file(path)) == token, "a resumed run keeps its token"
    path.chmod(0o644)
    auth.ensure_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert auth.read_file(auth.ensure_file(tmp_path / "other")) != token


def test_a_missing_or_empty_token_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_TOKEN_FILE, raising=False)
    with pytest.raises(TokenError, match=f"{ENV_TOKEN_FILE} is not set"):
        Auth.from_env()
    with pytest.raises(TokenError, match="cannot read the job's token from .*/nope"):
        Auth.from_env({ENV_TOKEN_FILE: str(tmp_path / "nope")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(TokenError, match="is empty"):
        Auth.from_env({ENV_TOKEN_FILE: str(tmp_path / "empty")})
    with pytest.raises(TokenError, match="is empty"):
        auth.ensure_file(tmp_path / "empty")


def test_only_the_bearer_token_itself_is_accepted_and_the_repr_hides_it(tmp_path):
    (tmp_path / "t").write_text("s3cret-token\n")
    a = Auth.from_env({ENV_TOKEN_FILE: str(tmp_path / "t")})
    assert a.accepts("Bearer s3cret-token") and a.accepts("bearer  s3cret-token ")
    for header in (None, "", "s3cret-token", "Basic s3cret-token", "Bearer s3cret", "Bearer s3cret-token2",
                   "Bearer", "Token s3cret-token"):
        assert not a.accepts(header), header
    assert "s3cret" not in repr(a) and a.headers() == {"Authorization": "Bearer s3cret-token"}


def test_health_probes_are_open_metrics_by_choice_everything_else_protected(tmp_path):
    (tmp_path / "t").write_text("x")
    default = Auth.from_env({ENV_TOKEN_FILE: str(tmp_path / "t")})
    locked = Auth.from_env({ENV_TOKEN_FILE: str(tmp_path / "t"), ENV_METRICS_AUTH: "true"})
    for path in ("/healthz", "/readyz"):
        assert not default.protects(path) and not locked.protects(path)
    assert not default.protects("/metrics") and locked.protects("/metrics")
    for path in ("/status", "/suspend", "/generate", "/v1/models", "/info", "/anything", "/healthz/x"):
        assert default.protects(path) and locked.protects(path)


def test_refusals_log_the_caller_once_per_window_with_a_count(monkeypatch, caplog):
    clock = [1000.0]
    monkeypatch.setattr(auth.time, "monotonic", lambda: clock[0])
    log = auth._RefusalLog(every=10)
    caplog.set_level(logging.WARNING, logger="grpojob.auth")
    for _ in range(5):
        log("10.1.2.3", "POST", "/suspend", "no token")
    log("10.9.9.9", "GET", "/status", "wrong token")
    clock[0] += 11
    log("10.1.2.3", "POST", "/suspend", "wrong token")
    assert [r.getMessage() for r in caplog.records] == [
        "refused POST /suspend from 10.1.2.3: no token",
        "refused GET /status from 10.9.9.9: wrong token",
        "refused POST /suspend from 10.1.2.3: wrong token (and 4 more refusals from it since the last line)"]
    assert caplog.records[0].peer == "10.1.2.3"
