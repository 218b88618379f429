"""The browser UI's forms, one module per page family, and what several read alike (inputs)."""
