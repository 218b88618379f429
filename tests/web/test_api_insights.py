import pytest

from moeops.insights.models import Finding, Note, PlanItem
from tests.api_base import make_world


@pytest.fixture
def world(db):
    return make_world()


FINDING = {
    "deployment": "glm-5-sglang",
    "kind": "idle_gpus",
    "severity": "critical",
    "title": "GPUs idle under load",
    "text": "0% utilization and ~85 W of 600 W at concurrency 128.",
    "evidence": {"gpu_util_median": 0.0, "power_w_median": 85.0},
}


def test_it_records_a_finding_by_a_person(world):
    run = world.run(status="succeeded")
    response = world.owner.post("/api/v1/findings", {**FINDING, "run": str(run.uuid)})
    assert response.status_code == 201
    body = response.json()
    assert (body["source"], body["state"], body["run"]) == ("human", "open", run.pk)
    assert body["evidence"]["power_w_median"] == 85.0


def test_it_confirms_and_dismisses_findings(world):
    finding_id = world.owner.post("/api/v1/findings", FINDING).json()["id"]
    confirmed = world.owner.patch(f"/api/v1/findings/{finding_id}", {"state": "confirmed"})
    assert confirmed.status_code == 200
    assert confirmed.json()["state"] == "confirmed"
    assert confirmed.json()["state_changed_at"] is not None
    dismissed = world.owner.patch(f"/api/v1/findings/{finding_id}", {"state": "dismissed"})
    assert dismissed.json()["state"] == "dismissed"
    bad = world.owner.patch(f"/api/v1/findings/{finding_id}", {"state": "ignored"})
    assert bad.status_code == 422
    assert bad.json()["message"].startswith("state:")
    assert Finding.objects.get().state == "dismissed"


def test_it_filters_findings(world):
    world.owner.post("/api/v1/findings", FINDING)
    world.owner.post("/api/v1/findings", {**FINDING, "kind": "plateau", "severity": "warning"})
    world.owner.post("/api/v1/findings", {**FINDING, "deployment": "glm-5-h200"})
    assert world.read_only.get("/api/v1/findings").json()["count"] == 3
    assert world.read_only.get("/api/v1/findings?deployment=glm-5-sglang").json()["count"] == 2
    assert world.read_only.get("/api/v1/findings?kind=plateau").json()["count"] == 1
    assert world.read_only.get("/api/v1/findings?state=open&severity=critical").json()["count"] == 2


def test_host_and_read_only_tokens_cannot_write_findings(world):
    assert world.host_worker.post("/api/v1/findings", FINDING).status_code == 403
    assert world.read_only.post("/api/v1/findings", FINDING).status_code == 403
    finding = Finding.objects.create(deployment=world.deployment, kind="other", title="t")
    patch = world.host_worker.patch(f"/api/v1/findings/{finding.pk}", {"state": "dismissed"})
    assert patch.status_code == 403


def test_it_keeps_a_plan(world):
    note = world.owner.post("/api/v1/notes", {"title": "Tune the fused MoE kernel"}).json()
    finding_id = world.owner.post("/api/v1/findings", FINDING).json()["id"]
    item = {
        "deployment": "glm-5-sglang",
        "title": "Tune fused_moe for RTX PRO 6000 (E=256, N=256)",
        "finding": finding_id,
        "note": note["slug"],
        "position": 1,
    }
    created = world.owner.post("/api/v1/plan-items", item)
    assert created.status_code == 201
    assert created.json()["note"] == "tune-the-fused-moe-kernel"
    moved = world.owner.patch(
        f"/api/v1/plan-items/{created.json()['id']}", {"status": "in_progress"}
    )
    assert moved.json()["status"] == "in_progress"
    listed = world.read_only.get("/api/v1/plan-items?deployment=glm-5-sglang&status=in_progress")
    assert listed.json()["count"] == 1
    other = world.owner.post("/api/v1/plan-items", {**item, "deployment": "glm-5-h200"})
    assert other.status_code == 404
    assert PlanItem.objects.count() == 1


def test_plan_items_from_the_api_append_and_move_like_the_pages(world):
    def add(title, **fields):
        body = {"deployment": "glm-5-sglang", "title": title, **fields}
        return world.owner.post("/api/v1/plan-items", body).json()

    first, second = add("raise the cap"), add("tune the kernel")
    third = add("turn the fusion off", position=0)

    order = [i["title"] for i in world.read_only.get("/api/v1/plan-items").json()["items"]]
    assert order == ["turn the fusion off", "raise the cap", "tune the kernel"]
    world.owner.patch(f"/api/v1/plan-items/{third['id']}", {"position": 2})
    positions = dict(PlanItem.objects.values_list("title", "position"))
    assert positions == {"raise the cap": 0, "tune the kernel": 1, "turn the fusion off": 2}
    assert (first["position"], second["position"]) == (0, 1)


def test_it_keeps_notes_in_markdown(world):
    body = {"title": "FlashInfer allreduce fusion on SM120", "body": "Unsupported: *off*.<script>"}
    first = world.owner.post("/api/v1/notes", body)
    assert first.status_code == 201
    note = first.json()
    assert note["slug"] == "flashinfer-allreduce-fusion-on-sm120"
    assert "<em>off</em>" in note["html"] and "<script>" not in note["html"]
    assert world.owner.post("/api/v1/notes", body).status_code == 200
    clash = world.owner.post("/api/v1/notes", {**body, "body": "something else"})
    assert clash.status_code == 409
    assert world.read_only.get(f"/api/v1/notes/{note['slug']}").json()["title"] == body["title"]
    assert world.read_only.get("/api/v1/notes").json()["count"] == 1
    assert Note.objects.count() == 1


def test_it_refuses_a_note_under_the_slug_of_the_create_page(world):
    # /notes/new/ creates a note: one stored under "new" could never be opened
    for body in ({"title": "New"}, {"title": "Anything", "slug": "new"}):
        response = world.owner.post("/api/v1/notes", body)
        assert response.status_code == 400, body
        assert response.json()["detail"] == "slug: “new” is reserved; pick another slug."
    assert not Note.objects.exists()


def test_a_note_slug_may_be_as_long_as_the_pages_allow(world):
    long = "a" * 200
    response = world.owner.post("/api/v1/notes", {"title": "Long", "slug": long})
    assert response.status_code == 201
    assert world.read_only.get(f"/api/v1/notes/{long}").json()["title"] == "Long"
    too_long = world.owner.post("/api/v1/notes", {"title": "Long", "slug": long + "a"})
    assert too_long.status_code == 422
    assert too_long.json()["message"].startswith("slug: ")


def test_findings_are_listed_most_important_first(world):
    for title, severity in (
        ("an info", "info"),
        ("a critical", "critical"),
        ("a warning", "warning"),
    ):
        world.owner.post("/api/v1/findings", {**FINDING, "title": title, "severity": severity})
    dismissed = world.owner.post("/api/v1/findings", {**FINDING, "title": "dismissed"}).json()
    world.owner.patch(f"/api/v1/findings/{dismissed['id']}", {"state": "dismissed"})
    titles = [f["title"] for f in world.owner.get("/api/v1/findings").json()["items"]]
    assert titles == ["a critical", "a warning", "an info", "dismissed"]


def test_the_open_findings_keep_the_one_order_of_importance(world):
    # open_by_importance leaves out by_importance's first rank, the same for every open one
    chart = {"chart": {"type": "lines", "x": [1], "y": [2]}}
    for i, (severity, evidence, state) in enumerate(
        [
            ("info", chart, "open"),
            ("critical", {}, "open"),
            ("warning", chart, "open"),
            ("critical", chart, "open"),
            ("warning", {}, "open"),
            ("critical", chart, "dismissed"),
            ("info", {}, "open"),
            ("warning", chart, "open"),
        ]
    ):
        Finding.objects.create(
            deployment=world.deployment,
            kind="plateau",
            key=f"k{i}",
            title=f"{severity} {i}",
            severity=severity,
            evidence=evidence,
            state=state,
        )
    every = [f.title for f in Finding.objects.by_importance() if f.state == "open"]
    assert [f.title for f in Finding.objects.open_by_importance()] == every
    assert every[:3] == ["critical 3", "critical 1", "warning 7"]
