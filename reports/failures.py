"""A failed request's reason and the engine's own words for it, as one line for people."""


def describe_failure(reason: str, detail: str | None) -> str:
    """ "HTTP 400: Token id 25531 is out of vocabulary" from ("http_400", "Token id …")."""
    head = f"HTTP {reason[5:]}" if reason.startswith("http_") else reason.replace("_", " ")
    return f"{head}: {detail}" if detail else head
