"""Plotly figures as plain dicts (data + layout), rendered in the page by plotly.js: one module
per page family, and what they share (figures, load).

Units as docs/metrics.md gives them: throughput in tok/s, latencies in ms, power in W, time as UTC
epoch s (shown as UTC dates).
"""
