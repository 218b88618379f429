"""API tokens: stored hashed, looked up by prefix, optionally bound to one host."""

import hashlib
import hmac
import secrets

from django.db import models

TOKEN_PREFIX_LEN = 8


def _hash(secret):
    return hashlib.sha256(secret.encode()).hexdigest()


class ApiToken(models.Model):
    name = models.CharField(max_length=100)
    # first characters of the token, stored in clear so one row can be found without a scan
    prefix = models.CharField(max_length=TOKEN_PREFIX_LEN, unique=True, editable=False)
    hashed = models.CharField(max_length=64, editable=False)
    host = models.ForeignKey(
        "fleet.Host", models.CASCADE, null=True, blank=True, related_name="api_tokens"
    )
    read_only = models.BooleanField(default=False)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, *, name, host=None, read_only=False):
        """Create a token; returns (row, plaintext). The plaintext is shown once, never stored."""
        while True:
            plaintext = "moe_" + secrets.token_urlsafe(30)
            prefix = plaintext[4 : 4 + TOKEN_PREFIX_LEN]
            if not cls.objects.filter(prefix=prefix).exists():
                break
        row = cls.objects.create(
            name=name, prefix=prefix, hashed=_hash(plaintext), host=host, read_only=read_only
        )
        return row, plaintext

    @classmethod
    def lookup(cls, plaintext):
        """The token row for a presented token, or None."""
        if not plaintext or not plaintext.startswith("moe_"):
            return None
        prefix = plaintext[4 : 4 + TOKEN_PREFIX_LEN]
        row = cls.objects.select_related("host").filter(prefix=prefix).first()
        if row is None or not hmac.compare_digest(row.hashed, _hash(plaintext)):
            return None
        return row
