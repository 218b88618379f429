import pytest

from moeops.api.models import ApiToken

pytestmark = pytest.mark.django_db


def test_it_stores_only_a_hash():
    row, plaintext = ApiToken.issue(name="ci")
    assert plaintext not in row.hashed
    assert plaintext.startswith("moe_")
    assert ApiToken.lookup(plaintext) == row


def test_it_rejects_a_wrong_secret_with_the_right_prefix():
    row, plaintext = ApiToken.issue(name="ci")
    forged = plaintext[:-3] + ("aaa" if not plaintext.endswith("aaa") else "bbb")
    assert ApiToken.lookup(forged) is None
    assert ApiToken.lookup("") is None
    assert ApiToken.lookup("not-a-token") is None
