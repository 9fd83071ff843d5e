"""The shared transport: what is retried, how long it waits, what it raises."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from fleet.core.errors import AuthFailed, OutcomeUnknown, ProviderError, RateLimited
from fleet.providers.http import Http, RetryPolicy, Secret, retry_after

Handler = Callable[[httpx.Request], httpx.Response]


class Script:
    """Answers requests from a list, in order; records them and the sleeps."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.sleeps: list[float] = []

    def __call__(self, req: httpx.Request) -> httpx.Response:
        self.requests.append(req)
        x = self.answers.pop(0)
        if isinstance(x, Exception):
            raise x
        return x

    def http(self, attempts: int = 4, **kw: object) -> Http:
        policy = RetryPolicy(attempts=attempts, base_delay=1.0, max_delay=4.0,
                             max_retry_after=60.0)
        return Http("vast", "https://x.test", Secret("k-123456"), retry=policy,
                    sleep=self.sleeps.append, rand=lambda: 0.5,
                    transport=httpx.MockTransport(self), hint_env="VAST_API_KEY", **kw)  # type: ignore[arg-type]


OK = httpx.Response(200, json={"ok": True})


def test_bearer_header_and_per_call_timeout() -> None:
    s = Script(OK, OK)
    h = s.http(timeout=30.0)
    h.request("GET", "/a", call="a")
    h.request("GET", "/b", call="b", timeout=3.0)
    assert s.requests[0].headers["Authorization"] == "Bearer k-123456"
    assert s.requests[0].extensions["timeout"]["read"] == 30.0
    assert s.requests[1].extensions["timeout"]["read"] == 3.0


def test_429_honours_retry_after() -> None:
    s = Script(httpx.Response(429, headers={"Retry-After": "7"}), OK)
    assert s.http().request("GET", "/", call="c").status_code == 200
    assert s.sleeps == [7.0]


def test_429_http_date_retry_after() -> None:
    when = datetime.now(UTC) + timedelta(seconds=30)
    resp = httpx.Response(429, headers={"Retry-After": format_datetime(when, usegmt=True)})
    assert 25 <= (retry_after(resp) or 0) <= 30
    assert retry_after(httpx.Response(429, headers={"Retry-After": "soon"})) is None
    assert retry_after(httpx.Response(429)) is None


def test_429_without_retry_after_backs_off_exponentially_with_jitter() -> None:
    plain = httpx.Response(429, text="API requests too frequent")
    s = Script(plain, plain, plain, OK)
    s.http().request("GET", "/", call="c")
    # base 1 s doubling, capped at 4 s; rand() = 0.5 gives 3/4 of each step
    assert s.sleeps == [0.75, 1.5, 3.0]


def test_backoff_jitter_stays_within_half_to_full_step_and_is_capped() -> None:
    p = RetryPolicy(base_delay=1.0, max_delay=4.0)
    assert [p.backoff(n, lambda: 0.0) for n in range(5)] == [0.5, 1.0, 2.0, 2.0, 2.0]
    assert [p.backoff(n, lambda: 1.0) for n in range(5)] == [1.0, 2.0, 4.0, 4.0, 4.0]


def test_429_exhausted_is_rate_limited_naming_provider_and_call() -> None:
    s = Script(*[httpx.Response(429, text="API requests too frequent")] * 3)
    with pytest.raises(RateLimited) as e:
        s.http(attempts=3).request("GET", "/", call="GET /api/v1/instances/")
    assert e.value.provider == "vast" and e.value.call == "GET /api/v1/instances/"
    assert "API requests too frequent" in str(e.value)
    assert len(s.requests) == 3 and len(s.sleeps) == 2


def test_retry_after_beyond_the_cap_is_returned_not_slept() -> None:
    s = Script(httpx.Response(429, headers={"Retry-After": "3600"}))
    with pytest.raises(RateLimited) as e:
        s.http().request("GET", "/", call="c")
    assert e.value.retry_after == 3600.0
    assert s.sleeps == []


def test_final_429_is_not_retried() -> None:
    s = Script(httpx.Response(429, json={"error": "search_quota_exceeded"}))
    with pytest.raises(RateLimited):
        s.http().request("GET", "/", call="c", final=lambda r: "quota" in r.text)
    assert len(s.requests) == 1


def test_5xx_retried_then_succeeds() -> None:
    s = Script(httpx.Response(502), httpx.Response(503, headers={"Retry-After": "2"}), OK)
    assert s.http().request("GET", "/", call="c").status_code == 200
    assert s.sleeps == [0.75, 2.0]


def test_5xx_exhausted_is_provider_error() -> None:
    s = Script(*[httpx.Response(500, text="boom")] * 2)
    with pytest.raises(ProviderError) as e:
        s.http(attempts=2).request("GET", "/", call="c")
    assert type(e.value) is ProviderError
    assert "HTTP 500: boom" in e.value.detail


@pytest.mark.parametrize("exc", [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"),
                                 httpx.RemoteProtocolError("dropped")])
def test_connection_errors_retried_for_idempotent_calls(exc: Exception) -> None:
    s = Script(exc, OK)
    assert s.http().request("GET", "/", call="c").status_code == 200
    assert s.sleeps == [0.75]


def test_connection_errors_exhausted() -> None:
    s = Script(*[httpx.ConnectError("refused")] * 2)
    with pytest.raises(ProviderError) as e:
        s.http(attempts=2).request("GET", "/", call="c")
    assert "no answer after 2 tries" in e.value.detail and "ConnectError" in e.value.detail


@pytest.mark.parametrize("answer", [httpx.ReadTimeout("slow"), httpx.RemoteProtocolError("x"),
                                    httpx.Response(502, text="bad gateway")])
def test_unknown_outcome_of_a_create_is_not_retried(answer: object) -> None:
    s = Script(answer)  # type: ignore[arg-type]
    with pytest.raises(OutcomeUnknown):
        s.http().request("PUT", "/asks/1/", call="create", idempotent=False)
    assert len(s.requests) == 1 and s.sleeps == []


def test_a_create_that_never_reached_the_server_is_retried() -> None:
    s = Script(httpx.ConnectError("refused"), httpx.Response(429), OK)
    s.http().request("PUT", "/asks/1/", call="create", idempotent=False)
    assert len(s.requests) == 3


@pytest.mark.parametrize("status", [401, 403])
def test_auth_failure_names_the_variable(status: int) -> None:
    s = Script(httpx.Response(status, json={"error": "auth_error", "msg": "Invalid user key"}))
    with pytest.raises(AuthFailed) as e:
        s.http().request("GET", "/", call="c")
    assert "VAST_API_KEY" in str(e.value) and "Invalid user key" in str(e.value)
    assert len(s.requests) == 1


def test_other_4xx_returned_to_the_client() -> None:
    s = Script(httpx.Response(404, json={"error": "not_found"}))
    assert s.http().request("GET", "/", call="c").status_code == 404


def test_long_bodies_are_cut_in_messages() -> None:
    s = Script(httpx.Response(500, text="x" * 5000))
    with pytest.raises(ProviderError) as e:
        s.http(attempts=1).request("GET", "/", call="c")
    assert len(str(e.value)) < 500


def test_the_providers_clients_share_httpx_default_tls_context(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import ssl

    def context(h: Http) -> ssl.SSLContext:
        return h._client._transport._pool._ssl_context  # type: ignore[attr-defined]

    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    a = Http("vast", "https://x.test", Secret("k-1"))
    b = Http("runpod", "https://y.test", Secret("k-2"))
    assert context(a) is context(b)  # the CA bundle loaded once
    mine, theirs = context(a), httpx.create_ssl_context()
    assert (mine.verify_mode, mine.check_hostname) == (ssl.CERT_REQUIRED, True)
    assert (mine.protocol, mine.options, mine.minimum_version) == \
        (theirs.protocol, theirs.options, theirs.minimum_version)
    assert mine.cert_store_stats() == theirs.cert_store_stats()
    # SSL_CERT_DIR names other CAs (an empty folder: none), as httpx reads it: another context
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))
    c = Http("vast", "https://x.test", Secret("k-1"))
    assert context(c) is not context(a)
    assert context(c).cert_store_stats()["x509_ca"] == 0 < mine.cert_store_stats()["x509_ca"]
