"""domain.failures: a worker's error as a sentence for people and the whole text as detail."""

from domain.failures import explain_error

SPREAD_REPR = (
    'SpreadTuneError("GPU 0 (batch sizes 1, 2, 4) exited with 1: AttributeError: module '
    "'torch._C' has no attribute '_cuda_setDevice' (see /var/t/gpu0.stderr.txt). 0 batch sizes "
    'are kept in /var/t: run again to tune only the missing ones")'
)


def test_a_host_without_cuda_is_said_in_a_sentence_of_its_own():
    sentence, detail = explain_error(SPREAD_REPR, "tune")
    assert sentence.startswith("This host cannot run CUDA")
    assert "(" not in sentence.split(":")[0] and "Error" not in sentence
    assert detail == SPREAD_REPR


def test_a_repr_loses_its_class_and_quotes():
    sentence, detail = explain_error("ValueError('no GPU to share the batch sizes over')", "tune")
    assert sentence == "The tune failed: no GPU to share the batch sizes over."
    assert detail == "ValueError('no GPU to share the batch sizes over')"


def test_name_and_message_keep_the_message():
    sentence, detail = explain_error("ConnectError: [Errno 111] Connection refused", "sweep")
    assert sentence == "The sweep failed: [Errno 111] Connection refused."
    assert detail == "ConnectError: [Errno 111] Connection refused"


def test_a_sentence_written_for_people_is_shown_as_it_is():
    text = "every request at concurrency 64 failed: HTTP 400: Token id 9 is out of vocabulary."
    assert explain_error(text, "sweep") == (text, "")


def test_a_long_text_is_cut_in_the_sentence_and_whole_in_the_detail():
    text = "RuntimeError: " + "x" * 500
    sentence, detail = explain_error(text)
    assert len(sentence) < 300 and sentence.endswith("…")
    assert detail == text


def test_nothing_explains_to_nothing():
    assert explain_error("") == ("", "")
