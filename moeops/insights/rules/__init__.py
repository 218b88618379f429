"""The diagnosis rules, one module per family (load, gpus, kernels, engine, regression), the run
data they read (run_data) and the evidence they carry (evidence); analysis.analyze applies them."""
