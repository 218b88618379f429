"""Writes to API tokens: make one (its plaintext shown once) and revoke one."""

from django.core.exceptions import ValidationError

from moeops.api.models import ApiToken


def token_issue(*, name, host=None, read_only=False):
    """(ApiToken, plaintext): a new token; only its hash is kept, so the plaintext is the
    caller's to show once. ValidationError on "name" for an empty one."""
    name = (name or "").strip()
    if not name:
        raise ValidationError({"name": "a token needs a name saying who or what uses it"})
    return ApiToken.issue(name=name, host=host, read_only=read_only)


def token_revoke(*, token):
    """Revoke the token: its row goes, and the next request that presents it gets 401."""
    token.delete()
