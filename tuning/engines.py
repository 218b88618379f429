"""The kernels a tune can time: moeops' builtin one, or an engine's own, and the engines' names
as messages give them. Cheap to import: the web tier reads it."""

ENGINE_TITLES = {"vllm": "vLLM", "sglang": "SGLang"}
ENGINES = ("builtin", *ENGINE_TITLES)
