import pytest
from django.core.exceptions import ValidationError

from moeops.insights import services
from moeops.insights.models import Note

pytestmark = pytest.mark.django_db


def test_a_slug_comes_from_the_title_when_none_is_given():
    assert services.note_slug(title="KVM to LXC") == "kvm-to-lxc"
    assert services.note_slug(title="KVM to LXC", slug="moved") == "moved"
    assert services.note_slug(title="???") == "note"
    assert len(services.note_slug(title="x" * 300)) == services.NOTE_SLUG_MAX_LENGTH


@pytest.mark.parametrize("fields", [{"title": "New"}, {"title": "x", "slug": "new"}])
def test_it_refuses_the_slug_of_the_create_page(fields):
    with pytest.raises(ValidationError) as refused:
        services.note_slug(**fields)
    assert refused.value.message_dict == {"slug": ["“new” is reserved; pick another slug."]}


def test_a_slug_of_digits_alone_is_never_made_nor_taken():
    # the API finds a note by id or slug: "2026" would read as note 2026
    assert services.note_slug(title="2026") == "note-2026"
    assert len(services.note_slug(title="9" * 300)) == services.NOTE_SLUG_MAX_LENGTH
    with pytest.raises(ValidationError) as refused:
        services.note_slug(title="x", slug="5")
    assert refused.value.message_dict == {
        "slug": ["“5” is digits alone, which the API reads as a note's id: add a letter."]
    }


def test_it_refuses_a_slug_longer_than_the_field():
    with pytest.raises(ValidationError, match="at most 200 characters, not 201"):
        services.note_slug(title="x", slug="a" * 201)


def test_create_is_idempotent_and_refuses_a_different_note_under_the_slug():
    note, created = services.note_create(title="SM120", body="off")
    assert (note.slug, created) == ("sm120", True)
    assert services.note_create(title="SM120", body="off") == (note, False)
    with pytest.raises(services.NoteConflict, match="a different note 'sm120' exists"):
        services.note_create(title="SM120", body="on")


def test_update_refuses_a_slug_another_note_has():
    services.note_create(title="SM120")
    note, _ = services.note_create(title="SM90")
    with pytest.raises(ValidationError, match="A note with the slug “sm120” exists."):
        services.note_update(note=note, title="SM90", slug="sm120", body="")
    assert services.note_update(note=note, title="SM90", slug="", body="b").slug == "sm90"
    assert Note.objects.get(pk=note.pk).body == "b"
