"""The fault suite, the spool: files in a worker's spool folder that hold no push (left by a
crash, a full disk or a hand) are moved aside with their reason; the host's work goes on."""

import json

from moeops.fleet.models import Host
from tests import page_base as pb
from tests.stack import FAULT_SUITE

pytest_plugins = ["tests.stack"]
pytestmark = FAULT_SUITE

ENTRY = {"method": "POST", "path": "/runs/x/levels", "body": {}}
# older than any push the worker writes, so each is read before the sweep's first push
POISON = {
    "01796307891654025847-99999-000001.json": ("[]", "a JSON list, not an object"),
    "01796307891654025847-99999-000002.json": (
        json.dumps({"path": "/runs/x/levels", "body": {}}),
        "method: Field required",
    ),
    "01796307891654025847-99999-000003.json": (
        json.dumps({**ENTRY, "retry_at": "soon"}),
        "retry_at: Input should be a valid number",
    ),
}


def test_a_spool_file_that_holds_no_push_is_moved_aside_and_the_sweep_runs(
    make_sweep_stack, client
):
    stack = make_sweep_stack(start_worker=False, MOEOPS_HEARTBEAT_S="0.5")
    # laid before the worker starts, since its start-up probe pushes and so replays the spool
    stack.spool_dir.mkdir(parents=True)
    for name, (text, _) in POISON.items():
        (stack.spool_dir / name).write_text(text)
    stack.worker.start()

    run = stack.start_sweep([8, 16], output_len=32)
    run = stack.wait_for_run(run)

    assert run.status == "succeeded", run.error
    assert [(lv.concurrency, lv.completed) for lv in run.levels.order_by("concurrency")] == [
        (8, 32),
        (16, 64),
    ]
    rejected = stack.spool_dir / "rejected"
    assert sorted(p.name for p in rejected.glob("*.json")) == sorted(POISON)
    for name, (text, reason) in POISON.items():
        assert (rejected / name).read_text() == text
        kept = (rejected / name.replace(".json", ".reason.txt")).read_text()
        assert kept == f"not a spool entry: {reason}\n"
    assert stack.wait_for_empty_spool() == []
    assert "AttributeError" not in stack.worker.log()

    # the host's heartbeat counts them, and its page shows it
    def reported():
        host = Host.objects.get(pk=stack.host.pk)
        spool = host.worker_status.get("spool")
        return host if spool == {"waiting": 0, "rejected": len(POISON)} else None

    host = stack.wait_until(reported, 10, "heartbeat counting the files moved aside")
    pb.sign_in(client)
    page = client.get(f"/hosts/{host.name}/").content.decode()
    assert f"{len(POISON)} rejected pushes" in page


def test_a_spool_entry_that_is_a_folder_or_a_dangling_link_is_moved_aside_and_the_sweep_runs(
    make_sweep_stack,
):
    stack = make_sweep_stack(start_worker=False)
    stack.spool_dir.mkdir(parents=True)
    folder = stack.spool_dir / "01796307891654025847-99999-000001.json"
    folder.mkdir()
    link = stack.spool_dir / "01796307891654025847-99999-000002.json"
    link.symlink_to(stack.spool_dir / "gone.json")
    stack.worker.start()

    run = stack.wait_for_run(stack.start_sweep([8], output_len=32))

    assert run.status == "succeeded", run.error
    rejected = stack.spool_dir / "rejected"
    assert (rejected / folder.name).is_dir() and (rejected / link.name).is_symlink()
    assert (rejected / "01796307891654025847-99999-000001.reason.txt").read_text() == (
        "not a spool entry: cannot be read: Is a directory\n"
    )
    assert "IsADirectoryError" not in stack.worker.log()


def test_a_sweep_whose_task_dies_before_it_starts_is_failed_with_the_cause(make_sweep_stack):
    stack = make_sweep_stack(start_worker=False)
    # a spool that cannot be made: every push the task makes raises
    stack.spool_dir.write_text("")
    stack.worker.start()

    run = stack.wait_for_run(stack.start_sweep([8], output_len=32), timeout=60)

    assert run.status == "failed"
    assert run.error.startswith("The worker's task failed: FileExistsError: ")
    assert str(stack.spool_dir) in run.error
    assert not run.levels.exists()
