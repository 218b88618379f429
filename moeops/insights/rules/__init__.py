"""The diagnosis rules, one module per family (load, gpus, kernels, engine, regression; steps:
a profiled level's step breakdown; paths: the engine's fast paths), the run data they read
(run_data) and the evidence they carry (evidence); analysis.analyze applies them."""
