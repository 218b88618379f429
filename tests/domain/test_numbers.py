"""domain.numbers: JSON's true and false are ints to Python, and neither tier counts them."""

import math

import pytest

from domain.numbers import is_integer, is_number


@pytest.mark.parametrize("value", [0, -3, 2.5, math.inf, 10**30])
def test_ints_and_floats_are_numbers(value):
    assert is_number(value)


@pytest.mark.parametrize("value", [True, False, None, "1", [1], {"n": 1}])
def test_bools_and_text_are_not(value):
    assert not is_number(value)
    assert not is_integer(value)


def test_an_integer_is_an_int_and_not_a_float():
    assert is_integer(64) and is_integer(-1)
    assert not is_integer(64.0)
