"""The host page's topology: nvidia-smi's link and P2P matrices as heatmaps."""

import re

from moeops.front.charts.figures import figure

_LINK_RANK = {"SYS": 0, "SOC": 0, "NODE": 1, "PHB": 2, "PXB": 3, "PIX": 4, "same board": 5}
_LINK_SCALE = [[0, "#fda29b"], [0.4, "#fedf89"], [0.8, "#a6f4c5"], [1, "#039855"]]
_P2P_SCALE = [[0, "#fda29b"], [1, "#a6f4c5"]]


def _link_value(cell):
    cell = str(cell).strip()
    if re.fullmatch(r"NV\d+", cell):
        return 6
    return _LINK_RANK.get(cell)


def _p2p_value(cell):
    cell = str(cell).strip()
    if cell in ("X", "unknown", "U", ""):
        return None
    return 1 if cell == "OK" else 0


def topology_heatmap(block, title, kind="links"):
    """A {labels, matrix} block of nvidia-smi codes as a heatmap, codes written in the cells.

    Links: NVLink best, then PIX, PXB, PHB, NODE, SYS worst. P2P: OK vs anything else.
    """
    if not block or not block.get("matrix"):
        return figure([], title, {}, {})
    value = _link_value if kind == "links" else _p2p_value
    labels, matrix = block["labels"], block["matrix"]
    columns = labels[: len(matrix[0])] if matrix else labels
    trace = {
        "type": "heatmap",
        "x": columns,
        "y": labels[: len(matrix)],
        "z": [[value(cell) for cell in row] for row in matrix],
        "text": [[str(cell) for cell in row] for row in matrix],
        "texttemplate": "%{text}",
        "hovertemplate": "%{y} ↔ %{x}: %{text}<extra></extra>",
        "colorscale": _LINK_SCALE if kind == "links" else _P2P_SCALE,
        "zmin": 0,
        "zmax": 6 if kind == "links" else 1,
        "showscale": False,
        "xgap": 2,
        "ygap": 2,
    }
    size = 40 + 34 * len(labels)
    return figure(
        [trace],
        title,
        {"side": "top", "type": "category"},
        {"autorange": "reversed", "type": "category"},
        height=max(size, 220),
        margin={"l": 60, "r": 10, "t": 70, "b": 10},
    )
