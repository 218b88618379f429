"""Notes render markdown and strip what a person could smuggle into the page."""

from moeops.insights.models import Note


def test_a_script_in_a_note_body_is_removed():
    note = Note(title="t", body="# Plateau\n\n<script>alert('x')</script>\n\n**806** tok/s")

    html = note.html()

    assert "<script" not in html and "alert" not in html
    assert "<h1>Plateau</h1>" in html and "<strong>806</strong>" in html


def test_event_handlers_and_javascript_links_are_removed():
    note = Note(
        title="t",
        body='<img src="x.png" onerror="alert(1)">\n\n[md](javascript:alert(1)) '
        '<a href="javascript:alert(2)">raw</a>',
    )

    html = note.html()

    assert "onerror" not in html and 'href="javascript' not in html


def test_tables_and_code_survive_sanitizing():
    note = Note(title="t", body="| c | tok/s |\n|---|---|\n| 128 | 806 |\n\n`--tp 8`")

    html = note.html()

    assert "<table>" in html and "<td>806</td>" in html and "<code>--tp 8</code>" in html
