"""The worker's one HTTP client of an engine (workers.engine_http), against a small real server
that answers what each test sets, and the callers that ask an engine through it."""

import json

import pytest

from tests import fakes
from workers import vocabulary
from workers.engine_http import EngineHTTP, EngineUnanswered
from workers.engine_metrics import EngineMetricsSampler, scrape_engine_metrics


@pytest.fixture(scope="module")
def engine_url():
    """(url, answers): a server on a free port; answers[path] = (status, body[, after_s])."""
    answers = {}
    not_found = (404, '{"detail": "Not Found"}')
    with fakes.scripted_http_server(lambda path: answers.get(path, not_found)) as url:
        yield url + "/", answers


def test_an_answer_keeps_its_status_body_and_json(engine_url):
    url, answers = engine_url
    answers["/version"] = (200, '{"version": "0.11.0"}')
    answers["/list"] = (200, "[1, 2]")

    with EngineHTTP(url, timeout_s=2) as engine:
        version = engine.get("/version")
        listed = engine.get("/list")

    assert version.url == url.rstrip("/") + "/version"
    assert (version.ok, version.status, version.kind) == (True, 200, "ok")
    assert version.json_object() == {"version": "0.11.0"}
    assert version.text_or_raise() == '{"version": "0.11.0"}'
    # JSON that is not an object is no object
    assert listed.ok and listed.json_object() is None


def test_a_refusal_keeps_the_engines_words_or_only_the_status_line(engine_url):
    url, answers = engine_url
    answers["/engine-error"] = (500, json.dumps({"error": {"message": "EngineCore died"}}))
    answers["/proxy"] = (502, "<html>upstream 10.0.0.7:8000 token=s3cr3t</html>")

    with EngineHTTP(url, timeout_s=2) as engine:
        died = engine.get("/engine-error")
        proxy = engine.get("/proxy")

    assert died.sentence() == f"{died.url} answered 500: EngineCore died"
    assert proxy.reason() == "Bad Gateway" and "s3cr3t" not in proxy.sentence()
    with pytest.raises(EngineUnanswered, match="answered 502: Bad Gateway") as raised:
        proxy.text_or_raise()
    assert raised.value.kind == "http_502"


def test_nothing_answering_is_a_sentence_not_an_exception(free_port):
    url = f"http://127.0.0.1:{free_port()}"

    with EngineHTTP(url, timeout_s=1) as engine:
        answer = engine.get("/health")

    assert answer.status is None and not answer.ok and answer.json_object() is None
    assert answer.kind == "ConnectError"
    assert answer.sentence().startswith(f"{url}/health did not answer: ConnectError: ")


def test_a_question_may_wait_longer_than_the_clients_timeout(engine_url):
    url, answers = engine_url
    answers["/slow"] = (200, "{}", 0.5)

    with EngineHTTP(url, timeout_s=0.1) as engine:
        hurried = engine.get("/slow")
        patient = engine.get("/slow", timeout_s=5)

    assert hurried.kind == "ReadTimeout"
    assert patient.ok


def test_metrics_that_are_refused_are_counted_by_status(engine_url):
    url, answers = engine_url
    answers["/metrics"] = (503, "busy")

    with pytest.raises(EngineUnanswered, match="answered 503"):
        scrape_engine_metrics(url)
    sampler = EngineMetricsSampler(url, interval_s=0.05, timeout_s=1)
    with EngineHTTP(url, timeout_s=1) as engine:
        assert sampler.sample_once(engine) is None
    assert sampler.errors == {"http_503": 1}


def test_the_model_folder_comes_from_the_model_list_or_sglangs_model_info(engine_url, free_port):
    url, answers = engine_url
    answers["/v1/models"] = (200, json.dumps({"data": [{"id": "m", "root": "/models/m"}]}))
    answers["/model_info"] = (200, json.dumps({"tokenizer_path": "/models/sglang-m"}))

    assert vocabulary.server_model_folder(url, "m") == "/models/m"
    assert vocabulary.server_model_folder(url, "other") == "/models/sglang-m"
    answers["/v1/models"] = (200, json.dumps({"data": "not a list"}))
    answers["/model_info"] = (500, json.dumps({"tokenizer_path": "/not/an/answer"}))
    assert vocabulary.server_model_folder(url, "m") is None
    assert vocabulary.server_model_folder(f"http://127.0.0.1:{free_port()}", "m") is None
