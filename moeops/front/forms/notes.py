"""The notes page's form."""

from django import forms

from moeops.insights.models import Note
from moeops.insights.services import note_slug, note_taken_refusal


class NoteForm(forms.ModelForm):
    class Meta:
        model = Note
        fields = ("title", "slug", "body")
        widgets = {"body": forms.Textarea(attrs={"rows": 18, "class": "mono"})}
        help_texts = {"slug": "Leave empty to derive it from the title.", "body": "Markdown."}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["slug"].required = False

    def clean(self):
        cleaned = super().clean()
        try:
            slug = note_slug(title=cleaned.get("title") or "", slug=cleaned.get("slug") or "")
        except forms.ValidationError as exc:
            self.add_error(None, exc)
            return cleaned
        refusal = note_taken_refusal(slug=slug, note=self.instance)
        if refusal:
            self.add_error("slug", refusal)
        # the model's own checks (blank, unique) see the slug the note will have
        cleaned["slug"] = self.instance.slug = slug
        return cleaned
