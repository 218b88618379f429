"""The worker's one HTTP client of an engine's own endpoints (/health, /metrics, /v1/models,
/version, /server_info, /get_server_info, /model_info, and the profiler's /start_profile and
/stop_profile).

Each question has a timeout (the client's, or its own), and nothing is raised: an answer is
an `EngineAnswer` that says what came back, or in a sentence why nothing did. The requests of a
load level go through `workers.loadgen`, whose transport is built for thousands of streams.

    with EngineHTTP("http://10.0.0.7:8000", timeout_s=10.0) as engine:
        listed = engine.get("/v1/models")
        models = (listed.json_object() or {}).get("data") if listed.ok else None
"""

from dataclasses import dataclass

import httpx

from workers.loadgen.stream import server_error_message


class EngineUnanswered(Exception):
    """A question the engine did not answer with 200; str() is the sentence, `kind` a short key
    to count failures by (httpx's error name, or http_<status>)."""

    def __init__(self, sentence: str, kind: str):
        super().__init__(sentence)
        self.kind = kind


@dataclass(frozen=True)
class EngineAnswer:
    """What came back from GET url: the response (status set), or nothing (status None, error
    "ConnectError: …", httpx's error name and words)."""

    url: str
    status: int | None
    response: httpx.Response | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def text(self) -> str:
        return self.response.text if self.response is not None else ""

    @property
    def kind(self) -> str:
        """A short key for counting failures: "ConnectError", "http_503", "ok"."""
        if self.status is None:
            return self.error.split(":", 1)[0]
        return "ok" if self.ok else f"http_{self.status}"

    def json_object(self) -> dict | None:
        """The body as a JSON object, or None when it is not one (nothing answered, not JSON,
        a list)."""
        if self.response is None:
            return None
        try:
            body = self.response.json()
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    def reason(self) -> str:
        """Why the question failed, in the engine's words: nothing answered → httpx's error; an
        answer → the message of the engine's OpenAI-style error body, else only the status
        line's reason phrase (never another service's body, e.g. a proxy's page)."""
        if self.response is None:
            return self.error
        return server_error_message(self.response.content, self.response.reason_phrase)

    def sentence(self) -> str:
        """ "<url> did not answer: ConnectError: …" or "<url> answered 503: <reason>"."""
        if self.status is None:
            return f"{self.url} did not answer: {self.error}"
        return f"{self.url} answered {self.status}: {self.reason()}"

    def text_or_raise(self) -> str:
        """The body of a 200 answer; raises EngineUnanswered otherwise."""
        if not self.ok:
            raise EngineUnanswered(self.sentence(), self.kind)
        return self.text


class EngineHTTP:
    """GETs to one engine's base URL over one connection pool; timeout_s (s) per question
    unless a question gives its own. Use as a context manager, or close()."""

    def __init__(self, base_url: str, *, timeout_s: float):
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._client = httpx.Client(timeout=timeout_s)

    def get(self, path: str, *, timeout_s: float | None = None) -> EngineAnswer:
        """GET base_url + path ("/metrics", "/server_info?config_format=json")."""
        url = self.base_url + path
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
        try:
            response = self._client.get(url, timeout=timeout)
        except httpx.HTTPError as exc:
            return EngineAnswer(url, None, error=f"{type(exc).__name__}: {exc}")
        return EngineAnswer(url, response.status_code, response)

    def post(self, path: str, body: dict | None = None, *, timeout_s: float | None = None):
        """POST base_url + path with a JSON body ("/start_profile", {"max_iterations": 40})."""
        url = self.base_url + path
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
        try:
            response = self._client.post(url, json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            return EngineAnswer(url, None, error=f"{type(exc).__name__}: {exc}")
        return EngineAnswer(url, response.status_code, response)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "EngineHTTP":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
