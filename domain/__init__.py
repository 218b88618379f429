"""The domain both tiers agree on: what engines and GPU hosts report and how it is read, the
figures of a level and its rounds, SLOs, capacity, cost, workloads, a run's progress and
snapshot as typed models, the statuses a job ends in, the hosts' queues.

Pure code: no Django, no HTTP, no GPU. The workers compute and send with it; the web tier reads,
checks and shows the same things with it (and reads them where they arrive in files, such as a
benchmark result that embeds the server's info).
"""
