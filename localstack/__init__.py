"""What runs a moeops stack on one machine, for `make run`, the tests and the benches, and is
never part of a GPU host's worker: the stand-in engine (a test double of an SGLang/vLLM server,
`python -m localstack.standin`) and free local ports to start servers on."""
