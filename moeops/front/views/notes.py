"""The team's knowledge base: markdown notes, rendered and sanitized by Note.html()."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render

from moeops.front.forms.notes import NoteForm
from moeops.insights import services
from moeops.insights.models import Note


def _note_or_404(slug):
    return get_object_or_404(Note, slug=slug)


@login_required
def notes(request):
    return render(request, "front/notes.html", {"nav": "notes", "notes": Note.objects.all()})


@login_required
def note_detail(request, slug):
    note = _note_or_404(slug)
    ctx = {
        "nav": "notes",
        "note": note,
        "findings": note.findings.select_related("deployment"),
        "plan_items": note.plan_items.select_related("deployment"),
    }
    return render(request, "front/note_detail.html", ctx)


def _edit(request, note):
    form = NoteForm(request.POST or None, instance=note)
    if request.method == "POST" and form.is_valid():
        fields = {name: form.cleaned_data[name] for name in ("title", "slug", "body")}
        if note.pk is None:
            note, _ = services.note_create(**fields)
        else:
            note = services.note_update(note=note, **fields)
        messages.success(request, "Note saved.")
        return redirect("note-detail", slug=note.slug)
    return render(request, "front/note_form.html", {"nav": "notes", "form": form, "note": note})


@login_required
def note_create(request):
    return _edit(request, Note())


@login_required
def note_edit(request, slug):
    return _edit(request, _note_or_404(slug))
