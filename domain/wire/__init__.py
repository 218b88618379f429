"""The wire between a GPU host's worker and the web tier: the bodies the worker pushes (a level,
a run's progress and status, GPU and engine samples, what it observed of the engine, a tune's
progress and timings, its heartbeat, an engine action's report) as pydantic models. The API
takes each body as its model; the worker's client validates each push against the same model
before it sends or spools it, so that a bad push fails on the GPU host, not in a replay.

Pure: no Django and no ninja (an import-linter contract holds it), so that both tiers import it.
"""
