"""domain.launch: an engine's command line changed flag by flag, and the engine's own report of
the values it runs with."""

import pytest

from domain import launch

VLLM = ["python", "-m", "vllm", "serve", "/models/glm-5", "--port", "8000", "--max-num-seqs=4"]


def test_a_flag_is_replaced_where_it_is_given_and_added_where_it_is_not():
    changed = launch.set_flags(VLLM, {"--max-num-seqs": "16", "--enforce-eager": ""})

    assert changed == [*VLLM[:-1], "--max-num-seqs", "16", "--enforce-eager"]
    assert VLLM[-1] == "--max-num-seqs=4"  # a new list
    assert launch.flag_value(changed, "--max-num-seqs") == "16"
    assert launch.flag_value(changed, "--enforce-eager") == ""
    assert launch.flag_value(changed, "--tp") is None


def test_none_removes_a_flag_and_its_value():
    argv = ["sglang", "--tp", "8", "--max-running-requests", "64", "--trust-remote-code"]
    assert launch.set_flags(argv, {"--max-running-requests": None}) == [
        "sglang",
        "--tp",
        "8",
        "--trust-remote-code",
    ]


@pytest.mark.parametrize("flag", ["max-num-seqs", "-n", "--", "--a=b", 7])
def test_a_flag_that_is_not_a_long_flag_is_refused(flag):
    with pytest.raises(launch.FlagError, match="not a long flag"):
        launch.set_flags(VLLM, {flag: "1"})


def test_flags_lists_a_command_line_flag_by_flag():
    argv = ["vllm", "serve", "--port", "8000", "--enforce-eager", "--max-num-seqs=4", "extra"]
    assert launch.flags(argv) == {
        "command": "vllm serve",
        "--port": "8000",
        "--enforce-eager": "",
        "--max-num-seqs": "4",
        "arguments": "extra",
    }


def test_a_flag_before_another_flag_or_at_the_end_takes_no_value_and_a_switch_none_at_all():
    argv = ["sglang", "--enable-lora", "--tp", "8", "--enforce-eager", "model", "--last"]

    assert launch.flag_value(argv, "--enable-lora") == launch.flag_value(argv, "--last") == ""
    assert launch.flags(argv) == {
        "command": "sglang",
        "--enable-lora": "",
        "--tp": "8",
        "--enforce-eager": "",
        "--last": "",
        "arguments": "model",
    }
    assert launch.set_flags(argv, {"--enable-lora": None, "--enforce-eager": None}) == [
        "sglang",
        "--tp",
        "8",
        "model",
        "--last",
    ]


def test_the_engines_report_is_found_under_its_own_name():
    vllm = {"scheduler_config.max_num_seqs": 16, "model_config.max_model_len": 1024}
    sglang = {"max_running_requests": 64, "enable_flashinfer_allreduce_fusion": False}

    assert launch.reported(vllm, "--max-num-seqs") == 16
    assert launch.reported(sglang, "--max-running-requests") == 64
    assert launch.reported(vllm, "--max-running-requests") is None
    assert launch.same_value(16, "16") and not launch.same_value(16, "8")
    assert launch.same_value(False, "false") and not launch.same_value(False, "true")
    assert launch.same_value("auto", "auto")


@pytest.mark.parametrize("value", ["lots", "0", "-4", "1.5", "", "１６", None])
def test_a_cap_flag_takes_a_whole_number_and_says_so_naming_it(value):
    argv = ["sglang", "--max-running-requests"] + ([value] if value else [])
    if value is not None:
        with pytest.raises(launch.FlagError, match="--max-num-seqs takes a whole number"):
            launch.set_flags(VLLM, {"--max-num-seqs": value})
        with pytest.raises(launch.FlagError, match="--max-running-requests takes a whole"):
            launch.check_values(argv)
    else:
        assert launch.set_flags(VLLM, {"--max-num-seqs": value}) == VLLM[:-1]
    launch.check_values([*VLLM[:-1], "--max-num-seqs", "0016"])
    assert launch.set_flags(VLLM, {"--tp": "lots"})[-2:] == ["--tp", "lots"]  # not a known flag
