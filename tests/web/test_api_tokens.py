import pytest

from moeops.api.models import ApiToken
from moeops.fleet.models import Host

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


def test_host_token_writes_only_its_host():
    h1 = Host.objects.create(name="h1")
    h2 = Host.objects.create(name="h2")
    row, _ = ApiToken.issue(name="worker", host=h1)
    assert row.may_write_host(h1)
    assert not row.may_write_host(h2)
    assert not row.may_write_host(None)


def test_read_only_token_writes_nothing():
    row, _ = ApiToken.issue(name="viewer", read_only=True)
    assert not row.may_write_host(None)
