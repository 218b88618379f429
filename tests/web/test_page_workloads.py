"""The workloads page: the list and the form that stores a workload; a dataset's bad file is
refused on the form by its name, line and reason, with nothing stored."""

import json
import re
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from moeops.runs.models import Workload
from tests import page_base as pb

pytestmark = pytest.mark.django_db
SHAREGPT = [
    {"conversations": [{"from": "human", "value": "Hello there"}, {"from": "gpt", "value": "Hi"}]},
    {"conversations": [{"from": "human", "value": "Explain routing"}]},
]


MT_BENCH = Path(__file__).parents[1] / "fixtures" / "workloads" / "mt_bench_questions.jsonl"


@pytest.fixture
def member(client):
    return pb.sign_in(client)


def _post(client, **fields):
    return client.post("/workloads/new/", fields)


def test_the_page_lists_workloads_and_offers_the_form(client, member):
    _post(client, name="chatty", kind="random", input_length="512-1536", output_length="128")

    html = client.get("/workloads/").content.decode()

    assert "chatty" in html and "input 512–1536 uniform, output 128" in html
    form = html.split('id="workload-create"')[1].split("</form>")[0]
    assert 'enctype="multipart/form-data"' in form


def test_it_stores_a_dataset_from_an_uploaded_sharegpt_file(client, member):
    upload = SimpleUploadedFile("chats.json", json.dumps(SHAREGPT).encode())

    response = _post(client, name="chats", kind="dataset", file=upload)

    assert response.status_code == 302
    workload = Workload.objects.get()
    assert (workload.layout, workload.item_count, workload.file_name) == (
        "sharegpt",
        2,
        "chats.json",
    )


def test_the_form_fills_in_no_output_length_so_a_datasets_answers_keep_theirs(client, member):
    html = client.get("/workloads/").content.decode()
    field = html.split('name="output_length"')[1].split(">")[0]
    assert "value=" not in field and 'placeholder="128"' in field
    upload = SimpleUploadedFile("chats.json", json.dumps(SHAREGPT).encode())

    # the form posted as the browser sends it: the untouched output field is empty
    _post(client, name="chats", kind="dataset", output_length="", file=upload)

    assert Workload.objects.get().spec == {"kind": "dataset", "output": None}


def test_a_random_workload_without_an_output_length_is_refused_on_its_field(client, member):
    response = _post(client, name="r", kind="random", input_length="512", output_length="")

    assert response.status_code == 400
    assert "output: a random workload needs an output length" in response.content.decode()
    assert not Workload.objects.exists()


def test_a_multi_turn_workload_takes_an_mt_bench_file_on_the_form(client, member):
    upload = SimpleUploadedFile(MT_BENCH.name, MT_BENCH.read_bytes())

    response = _post(client, name="mt-bench", kind="multi_turn", think_time_s="1", file=upload)

    assert response.status_code == 302
    workload = Workload.objects.get()
    assert (workload.layout, workload.item_count) == ("mtbench", 8)
    assert workload.spec["from_file"] is True and workload.spec["output"] is None
    html = client.get("/workloads/").content.decode()
    assert "the file&#x27;s conversations, every turn, output from the file&#x27;s answers" in html


def test_it_stores_a_shared_prefix_workload(client, member):
    response = _post(
        client,
        name="prefix",
        kind="shared_prefix",
        groups="4",
        prefix_len="512",
        question_len="64",
        output_length="1000 ratio 0.5 sglang",
    )

    assert response.status_code == 302
    assert Workload.objects.get().spec == {
        "kind": "shared_prefix",
        "groups": 4,
        "prefix_len": 512,
        "question_len": 64,
        "output": {"distribution": "uniform", "low": 500, "high": 1000},
    }


@pytest.mark.parametrize(
    ("name", "data", "extra", "message"),
    [
        ("empty.txt", b"", {}, "empty.txt: the file is empty"),
        ("nohuman.jsonl", b'{"messages": [{"role": "assistant", "content": "hi"}]}', {},
         "nohuman.jsonl, line 1: a conversation with no human turn in its messages"),
        ("odd.json", b'[{"prompt": "x"}]', {}, "odd.json, line 1: neither a ShareGPT"),
        ("long.txt", b"a b c d e f g h\n", {"context_len": "4"},
         "long.txt, line 1: the prompt has at least 8 tokens (its words), over the context "
         "length of 4"),
        ("image.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00", {},
         "image.png, line 3: a NUL byte: the file is binary, not text"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_on_the_form_and_nothing_is_stored(
    client, member, name, data, extra, message
):
    upload = SimpleUploadedFile(name, data)

    response = _post(client, name="bad", kind="dataset", file=upload, **extra)

    assert response.status_code == 400
    assert message in response.content.decode().replace("&#x27;", "'").replace("&quot;", '"')
    assert not Workload.objects.exists()


class _EndlessUpload:
    """wsgi.input of a multipart form whose file part claims 200 MB; counts the bytes read."""

    def __init__(self, head, size):
        self.head = head
        self.left = size
        self.read_bytes = 0

    def read(self, size=-1):
        size = self.left if size is None or size < 0 else min(size, self.left)
        out = self.head[:size]
        self.head = self.head[size:]
        out += b"a" * (size - len(out))
        self.left -= size
        self.read_bytes += size
        return out

    def readline(self, size=-1):
        return self.read(size)


def test_a_200_mb_upload_is_refused_by_its_size_before_it_is_read(client, member):
    boundary = "moeopsboundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\nbig\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="kind"\r\n\r\ndataset\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        'filename="huge.jsonl"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode()
    size = 200 * 1024 * 1024
    stream = _EndlessUpload(head, size)

    response = client.post(
        "/workloads/new/",
        # the test client sets neither header for an empty body: the stream is the body
        CONTENT_TYPE=f"multipart/form-data; boundary={boundary}",
        CONTENT_LENGTH=str(size),
        **{"wsgi.input": stream},
    )

    assert response.status_code == 400
    assert (
        f"huge.jsonl: refused unread, its upload of {size:,} bytes is larger than a dataset may be"
        in response.content.decode()
    )
    assert stream.read_bytes < 1024 * 1024
    assert not Workload.objects.exists()


def test_it_stores_a_trace_from_the_form_and_refuses_a_bad_one_naming_its_line(client, member):
    good = b'{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [1, 2]}\n'
    bad = good + b'{"timestamp": -5, "input_length": 20, "output_length": 2}\n'

    stored = _post(
        client,
        name="prod",
        kind="trace",
        block_size="16",
        speed="2",
        file=SimpleUploadedFile("t.jsonl", good),
    )
    refused = _post(
        client, name="bad", kind="trace", block_size="16", file=SimpleUploadedFile("bad.jsonl", bad)
    )

    assert stored.status_code == 302
    workload = Workload.objects.get()
    assert workload.spec == {"kind": "trace", "block_size": 16, "speed": 2.0}
    assert workload.items[0]["hash_ids"] == [1, 2]
    assert refused.status_code == 400
    html = refused.content.decode().replace("&#x27;", "'")
    assert "bad.jsonl, line 2: timestamp: ms since the first request" in html, re.findall(
        r"errorlist.{0,300}", html
    )
    assert Workload.objects.count() == 1
