"""What several forms read alike: a list of whole numbers, an uploaded file's text."""

from django import forms
from django.conf import settings


def int_list(text, *, field_name):
    """ "32, 64,128" → [32, 64, 128]: positive, distinct, ascending."""
    try:
        values = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise forms.ValidationError(f"{field_name}: whole numbers separated by commas") from None
    if not values:
        raise forms.ValidationError(f"{field_name}: give at least one")
    if any(v < 1 for v in values):
        raise forms.ValidationError(f"{field_name}: every value must be at least 1")
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise forms.ValidationError(
            f"{field_name}: give each value once ({', '.join(map(str, repeated))} is given "
            "more than once)"
        )
    return sorted(values)


def uploaded_text(upload):
    """An uploaded file's text; ValidationError past the API's body limit or when not UTF-8."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if upload.size > limit:
        raise forms.ValidationError(
            f"The file is larger than {limit:,} bytes (MOEOPS_MAX_BODY_BYTES), as the API refuses."
        )
    try:
        return upload.read().decode("utf-8")
    except UnicodeDecodeError:
        raise forms.ValidationError("The file is not UTF-8 text.") from None
