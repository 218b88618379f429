import json

import pytest

from moeops.kernels.models import KernelConfig, TuningRun, TuningTiming
from tests import page_base as pb

pytestmark = pytest.mark.django_db


def _entry(m, n=64, k=128, warps=4, stages=3):
    return {
        "BLOCK_SIZE_M": m,
        "BLOCK_SIZE_N": n,
        "BLOCK_SIZE_K": k,
        "GROUP_SIZE_M": 1,
        "num_warps": warps,
        "num_stages": stages,
    }


@pytest.fixture
def configs(client):
    pb.sign_in(client)
    v1 = pb.h200_fp8_config(
        {"1": _entry(16), "64": _entry(64), "1024": _entry(128, n=128)}, source="imported"
    )
    v2 = pb.h200_fp8_config(
        {"1": _entry(16), "64": _entry(64, warps=8), "4096": _entry(256, n=128)}, source="tuned"
    )
    return v1, v2


def test_the_list_names_each_config_file(client, configs):
    html = client.get("/kernels/").content.decode()
    assert "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json" in html
    assert ">v2<" in html and ">v1<" in html


def test_entries_are_a_colored_table_per_batch_size(client, configs):
    _, v2 = configs
    html = client.get(f"/kernels/{v2.pk}/").content.decode()
    table = html.split('class="data compact entries"')[1].split("</table>")[0]
    rows = table.split("<tr>")[2:]
    assert [row.split("</th>")[0].rsplit(">", 1)[1] for row in rows] == ["1", "64", "4096"]
    # BLOCK_SIZE_M 16 is the column's lightest cell, 256 its darkest
    assert 'style="background: hsl(218, 70%, 96%)">16<' in rows[0]
    assert 'style="background: hsl(218, 70%, 62%)">256<' in rows[2]


def test_downloads_carry_each_engines_file_name_and_content(client, configs):
    _, v2 = configs
    vllm = client.get(f"/kernels/{v2.pk}/vllm.json")
    assert (
        'filename="E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"'
        in vllm["Content-Disposition"]
    )
    body = json.loads(vllm.content)
    assert body["triton_version"] == "3.7.1"
    assert body["64"]["num_warps"] == 8
    sglang = client.get(f"/kernels/{v2.pk}/sglang.json")
    assert "block_shape=[128, 128].json" in sglang["Content-Disposition"]
    assert "triton_version" not in json.loads(sglang.content)
    assert client.get(f"/kernels/{v2.pk}/tensorrt.json").status_code == 404
    html = client.get(f"/kernels/{v2.pk}/").content.decode()
    assert "triton_3_7_1/E=256,N=256" in html


def test_the_diff_marks_changed_and_one_sided_batch_sizes(client, configs):
    v1, v2 = configs
    html = client.get(f"/kernels/diff/?a={v1.pk}&b={v2.pk}").content.decode()
    assert "3 batch sizes differ" in html
    assert "<del>4</del> → <ins>8</ins>" in html  # num_warps at M=64
    assert "A only" in html and "B only" in html
    detail = client.get(f"/kernels/{v2.pk}/").content.decode()
    assert f"/kernels/diff/?a={v1.pk}&amp;b={v2.pk}" in detail


def test_timings_chart_tuned_default_and_floor(client, configs):
    _, v2 = configs
    tuning = TuningRun.objects.create(
        E=256, N=256, hidden_size=6144, topk=8, status="succeeded", result=v2
    )
    for m, tuned, default, floor in ((1, 20.0, 31.0, 18.0), (64, 560.0, 800.0, 490.0)):
        TuningTiming.objects.create(
            run=tuning, batch_size=m, tuned_us=tuned, default_us=default, floor_us=floor
        )
    html = client.get(f"/kernels/{v2.pk}/").content.decode()
    traces = {t["name"]: t for t in pb.figure(html, "timings-data")["data"]}
    assert traces["tuned"]["y"] == [20.0, 560.0]
    assert traces["default config"]["y"] == [31.0, 800.0]
    assert traces["hardware floor"]["y"] == [18.0, 490.0]
    assert pb.figure(html, "timings-data")["layout"]["yaxis"]["type"] == "log"


def test_a_config_without_a_tune_says_so(client, configs):
    v1, _ = configs
    html = client.get(f"/kernels/{v1.pk}/").content.decode()
    assert "No timings recorded yet." in html


def test_a_down_config_carries_a_badge_and_only_its_sglang_file(client, configs):
    down = pb.h200_fp8_config({"1": _entry(16), "64": _entry(32)}, source="tuned", down_moe=True)
    assert down.version == 1  # a series of its own beside the main file's v1 and v2
    name = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json"
    listing = client.get("/kernels/").content.decode()
    assert name in listing and ">down (GEMM 2)</span>" in listing
    html = client.get(f"/kernels/{down.pk}/").content.decode()
    assert ">down (GEMM 2)</span>" in html
    assert f"triton_3_7_1/{name}" in html
    assert "Download for vLLM" not in html and "vLLM has no _down files" in html
    assert client.get(f"/kernels/{down.pk}/vllm.json").status_code == 404
    sglang = client.get(f"/kernels/{down.pk}/sglang.json")
    assert name in sglang["Content-Disposition"]
    assert json.loads(sglang.content)["64"] == _entry(32)


VLLM_SOURCE = "8f71154b" + "0" * 56


def _tune_with_timings(config, **kernel):
    tuning = TuningRun.objects.create(
        E=256, N=256, hidden_size=6144, topk=8, status="succeeded", result=config, **kernel
    )
    rows = (
        (1, 20.0, 20.0, None, "default"),
        (64, 560.0, 800.0, 700.0, "tuned"),
        (1024, 900.0, 1000.0, 900.0, "shipped"),
    )
    for m, tuned, default, shipped, picked in rows:
        TuningTiming.objects.create(
            run=tuning,
            batch_size=m,
            tuned_us=tuned,
            default_us=default,
            shipped_us=shipped,
            picked=picked,
        )
    return tuning


def test_it_shows_the_kernel_a_config_was_tuned_on_and_each_configs_source(
    client, configs, django_assert_max_num_queries
):
    _, v2 = configs
    kernel = {"kernel_engine": "vllm", "kernel_version": "0.32.0"}
    KernelConfig.objects.filter(pk=v2.pk).update(**kernel, kernel_source_sha256=VLLM_SOURCE)
    _tune_with_timings(v2, engine="vllm", **kernel, kernel_source_sha256=VLLM_SOURCE)

    # 7, and 1 for the deployments that load it (none here: their GPUs and recipes prefetched)
    with django_assert_max_num_queries(8):
        html = client.get(f"/kernels/{v2.pk}/").content.decode()

    source = f'<code title="sha256 {VLLM_SOURCE}">8f71154b…</code>'
    assert f"<dt>Tuned on</dt><dd>vLLM 0.32.0&#x27;s own kernel · source {source}" in html
    table = html.split("<tbody>")[-1].split("</tbody>")[0]
    rows = table.split("<tr>")[1:]
    # M=64: the search's best, 800 / 560 µs over the default, 700 / 560 over the shipped entry
    assert "the search&#x27;s best" in rows[1] and "1.43×" in rows[1] and "1.25×" in rows[1]
    assert "the engine&#x27;s default" in rows[0]
    assert "the engine&#x27;s shipped file" in rows[2]
    traces = {t["name"]: t for t in pb.figure(html, "timings-data")["data"]}
    assert traces["shipped config"]["x"] == [64, 1024]
    assert traces["shipped config"]["y"] == [700.0, 900.0]
    # the gains, which the µs chart's log axis squeezes, drawn as speed-ups over 1×
    speedups = pb.figure(html, "speedups-data")
    traces = {t["name"]: (t["x"], t["y"]) for t in speedups["data"]}
    assert traces == {
        "vs the engine's default": ([1, 64, 1024], [1.0, 800 / 560, 1000 / 900]),
        "vs the engine's shipped file": ([64, 1024], [700 / 560, 1.0]),
    }
    assert speedups["layout"]["shapes"][0]["y0"] == 1


def test_a_config_tuned_in_one_engines_kernel_is_not_offered_as_timed_for_the_other(
    client, configs
):
    v1, v2 = configs
    KernelConfig.objects.filter(pk=v2.pk).update(kernel_engine="vllm", kernel_version="0.33.0")
    html = client.get(f"/kernels/{v2.pk}/").content.decode()
    warning = (
        "Tuned in vLLM 0.33.0&#x27;s own kernel, never timed in SGLang&#x27;s: it may run "
        "slower there than SGLang&#x27;s own configs; tune with SGLang&#x27;s kernel for SGLang."
    )
    assert f'<span class="small untimed">{warning}</span>' in html
    assert f'class="button" href="/kernels/{v2.pk}/sglang.json" download title="{warning}"' in html
    assert f'class="button primary" href="/kernels/{v2.pk}/vllm.json" download>' in html
    # the builtin kernel is neither engine's; an imported file's kernel is not known
    KernelConfig.objects.filter(pk=v2.pk).update(kernel_engine="builtin", kernel_version="")
    builtin = client.get(f"/kernels/{v2.pk}/").content.decode()
    assert builtin.count('<span class="small untimed">Tuned in moeops&#x27; builtin kernel') == 2
    imported = client.get(f"/kernels/{v1.pk}/").content.decode()
    assert "untimed" not in imported and imported.count('class="button primary"') == 2


def test_the_builtin_kernel_is_named_and_an_imported_files_is_not_recorded(client, configs):
    v1, v2 = configs
    KernelConfig.objects.filter(pk=v2.pk).update(kernel_engine="builtin", kernel_version="moeops")
    builtin = client.get(f"/kernels/{v2.pk}/").content.decode()
    assert "moeops&#x27; builtin kernel (the engines&#x27; launch before vLLM 0.32)" in builtin
    imported = client.get(f"/kernels/{v1.pk}/").content.decode()
    assert '<dt>Tuned on</dt><dd><span class="muted">not recorded</span>' in imported
    # the engines' files stay in their exact format: nothing of the kernel in them
    assert set(json.loads(client.get(f"/kernels/{v2.pk}/vllm.json").content)) == {
        "triton_version",
        "1",
        "64",
        "4096",
    }


def test_each_file_says_which_engine_kernels_it_was_timed_in(client, configs):
    from moeops.examples.h200_tune import load_h200_tune

    tuned = load_h200_tune().result
    imported, _ = configs

    listing = client.get("/kernels/").content.decode()
    detail = client.get(f"/kernels/{tuned.pk}/").content.decode()

    row = next(r for r in listing.split("<tr>") if f'href="/kernels/{tuned.pk}/"' in r)
    assert "vLLM 0.33.0&#x27;s own kernel</td>" in row
    other = next(r for r in listing.split("<tr>") if f'href="/kernels/{imported.pk}/"' in r)
    assert '<span class="muted">not recorded</span></td>' in other
    assert "<dt>Timed in</dt><dd>vLLM 0.33.0&#x27;s own kernel " in detail
