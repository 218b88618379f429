"""What both tiers take for a number in the JSON they read: JSON's true and false are ints to
Python (True == 1), and a flag is no count, size or time."""


def is_number(value) -> bool:
    """An int or a float, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_integer(value) -> bool:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)
