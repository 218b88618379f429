import pytest

from moeops.insights.models import Note, PlanItem
from tests import page_base as pb

pytestmark = pytest.mark.django_db


@pytest.fixture
def note(client):
    pb.sign_in(client)
    return Note.objects.create(
        title="SM120 allreduce",
        slug="sm120-allreduce",
        body="FlashInfer allreduce fusion is **unsupported** on SM120.\n\n"
        "<script>alert(1)</script>",
    )


def test_a_note_is_rendered_and_sanitized(client, note):
    html = client.get("/notes/sm120-allreduce/").content.decode()
    assert "<strong>unsupported</strong>" in html
    assert "alert(1)" not in html


def test_notes_list_links_each_note(client, note):
    html = client.get("/notes/").content.decode()
    assert 'href="/notes/sm120-allreduce/"' in html


def test_it_creates_a_note_with_a_slug_from_its_title(client):
    pb.sign_in(client)
    response = client.post("/notes/new/", {"title": "KVM to LXC", "slug": "", "body": "# moved"})
    assert response["Location"] == "/notes/kvm-to-lxc/"
    assert Note.objects.get().html().startswith("<h1>moved</h1>")


def test_it_edits_a_note(client, note):
    client.post(
        "/notes/sm120-allreduce/edit/",
        {"title": "SM120", "slug": "sm120-allreduce", "body": "off"},
    )
    note.refresh_from_db()
    assert (note.title, note.body) == ("SM120", "off")


def test_it_refuses_a_taken_or_reserved_slug(client, note):
    response = client.post("/notes/new/", {"title": "x", "slug": "sm120-allreduce", "body": ""})
    assert "exists" in response.content.decode()
    response = client.post("/notes/new/", {"title": "New", "slug": "", "body": ""})
    assert "reserved" in response.content.decode()
    assert Note.objects.count() == 1


def test_a_note_lists_what_links_to_it(client, note):
    deployment = pb.deployment()
    PlanItem.objects.create(deployment=deployment, title="turn fusion off", note=note)
    html = client.get("/notes/sm120-allreduce/").content.decode()
    assert "Plan item" in html and "turn fusion off" in html
