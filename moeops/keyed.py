"""Writes under a key the client chose (a run's uuid, a level's key): the same key sent again
with the same body is a repeat and answers what was stored; with another body it is refused,
since storing one and answering 200 would drop the other without a word."""

import hashlib
import json

# Stored beside each keyed row: the canonical hash of the body it was stored from.
BODY_SHA256_HELP = "SHA-256 of the body stored under this key; empty when stored before hashing"


class KeyConflict(Exception):
    """A key is already stored with another body (answered 409)."""


def body_sha256(body):
    """Hex SHA-256 of the canonical JSON of a validated body (keys sorted; model rows, UUIDs and
    times as their str), so that the same key sent again with another body is told from a
    repeat."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


def same_body(stored, digest, what):
    """The row a key names when it was stored from the body whose hash is digest (a repeat);
    KeyConflict naming the key when not. A row stored before bodies were hashed is a repeat."""
    if stored.body_sha256 and stored.body_sha256 != digest:
        raise KeyConflict(
            f"{what} is already stored with another body: a key is stored once, "
            "send it again only with the same body"
        )
    return stored


def stored_under(rows, key, digest, what, owned):
    """The row of `rows` stored under the client-chosen uuid `key`, answered as same_body
    answers a repeat; None when no key was sent or nothing is stored under it yet. owned(row)
    returns the row, or raises when it is another owner's (a run of another deployment)."""
    row = None if key is None else rows.filter(uuid=key).first()
    return None if row is None else same_body(owned(row), digest, what)


def stored_meanwhile(rows, key, digest, what, owned):
    """The row that another request stored under `key` between stored_under's look-up and this
    request's insert (whose IntegrityError says so), answered as stored_under answers it."""
    return same_body(owned(rows.get(uuid=key)), digest, what)
