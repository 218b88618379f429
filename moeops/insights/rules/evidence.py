"""The evidence helpers of the rules: the figure each proposal's evidence carries under "chart"
(line, bar, heatmap; the shapes analysis.py's docstring gives), rounding, and finding keys."""

import hashlib

FINDING_KEY_MAX = 100


# -- evidence helpers ------------------------------------------------------------------------


def _line(x, x_label, y_label, series):
    return _figure("line", x, x_label, y_label, series)


def _bar(x, x_label, y_label, series):
    return _figure("bar", x, x_label, y_label, series)


def _figure(kind, x, x_label, y_label, series):
    return {
        "type": kind,
        "x": list(x),
        "x_label": x_label,
        "y_label": y_label,
        "series": [{"name": name, "y": list(y)} for name, y in series],
    }


def _heatmap(sub, title):
    return {
        "type": "heatmap",
        "title": title,
        "x": sub["labels"],
        "y": sub["labels"],
        "z": sub["matrix"],
        "x_label": "GPU",
        "y_label": "GPU",
    }


def _round(value, digits=4):
    return None if value is None else round(value, digits)


def _pct(fraction):
    return f"{fraction:+.1%}"


def _change_per_doubling(fraction):
    """ "grows +4.0%", "falls 1.8%", "stays flat": a fall is not said to grow."""
    if round(fraction, 3) == 0:
        return "stays flat"
    return f"grows {_pct(fraction)}" if fraction > 0 else f"falls {-fraction:.1%}"


def _key(*parts):
    """A finding key from its parts; hashed when too long for the column."""
    key = ":".join("x".join(map(str, p)) if isinstance(p, tuple) else str(p) for p in parts)
    if len(key) <= FINDING_KEY_MAX:
        return key
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return f"{key[: FINDING_KEY_MAX - 17]}~{digest}"
