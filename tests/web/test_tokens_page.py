"""The API tokens page (/tokens/): staff make a token, shown once, and revoke it; members read
the list; and /api/v1/ itself answers with links to the schema, docs and this page."""

import re

import pytest
from django.test import Client

from moeops.api.models import ApiToken
from tests import page_base

pytestmark = pytest.mark.django_db


def _bearer(plaintext):
    return Client(headers={"authorization": f"Bearer {plaintext}"})


def test_staff_make_a_token_that_the_api_takes_then_revoke_it(client):
    page_base.sign_in(client, "ops", staff=True)
    host = page_base.host("h200-a")
    response = client.post("/tokens/", {"name": "worker-h200", "host": host.pk})
    assert response.status_code == 200
    html = response.content.decode()
    plaintext = re.search(r'value="(moe_[^"]+)" id="token-plaintext"', html).group(1)
    token = ApiToken.objects.get()
    assert (token.name, token.host, token.read_only) == ("worker-h200", host, False)
    assert ApiToken.lookup(plaintext) == token
    assert _bearer(plaintext).get("/api/v1/deployments").status_code == 200
    # shown once: the list shows its first characters only
    listed = client.get("/tokens/").content.decode()
    assert plaintext not in listed
    assert f"moe_{token.prefix}…" in listed

    response = client.post(f"/tokens/{token.pk}/revoke/", follow=True)
    assert "Token worker-h200" in response.content.decode()
    assert not ApiToken.objects.exists()
    assert _bearer(plaintext).get("/api/v1/deployments").status_code == 401


def test_a_token_needs_a_name(client):
    page_base.sign_in(client, "ops", staff=True)
    response = client.post("/tokens/", {"name": "  ", "read_only": "on"})
    assert response.status_code == 400
    assert not ApiToken.objects.exists()


def test_members_read_the_list_but_neither_make_nor_revoke(client):
    token, _ = ApiToken.issue(name="ci", read_only=True)
    page_base.sign_in(client)
    html = client.get("/tokens/").content.decode()
    assert "ci" in html and f"moe_{token.prefix}…" in html
    assert 'id="token-form"' not in html
    assert client.post("/tokens/", {"name": "mine"}).status_code == 403
    assert client.post(f"/tokens/{token.pk}/revoke/").status_code == 403
    assert list(ApiToken.objects.all()) == [token]


def test_the_page_needs_a_sign_in(client):
    assert client.get("/tokens/").status_code == 302


def test_the_api_root_links_its_schema_docs_and_tokens_page(client):
    response = client.get("/api/v1/")
    assert response.status_code == 200
    links = response.json()
    assert links["schema"] == "http://testserver/api/v1/openapi.json"
    assert links["docs"] == "http://testserver/api/v1/docs"
    assert links["tokens"] == "http://testserver/tokens/"
    assert client.get(links["schema"]).status_code == 200
    assert client.post("/api/v1/").status_code == 405
