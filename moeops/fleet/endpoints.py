"""Which addresses a deployment's endpoint may name. The host's worker fetches that URL (health
checks, sweeps, /metrics), so an endpoint is a request the worker makes on someone's word: it
may name only the host itself (its name, or an address in MOEOPS_ENDPOINT_ALLOWLIST, loopback by
default) and only staff may point a deployment at a new address."""

import ipaddress
import re
from urllib.parse import urlsplit

from django.conf import settings

from moeops import permissions

# A DNS name: labels of letters, digits, "-" (and "_", which some lab names hold), dot-separated.
HOST_NAME = re.compile(
    r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*"
)


def endpoint_refusal(*, host, url):
    """Why the worker of `host` may not be sent to `url`, or "" when it may (an empty URL may).

    `url` is the engine server's base URL (scheme, host, port): a path, query or fragment is
    refused, as is a host part that is no host name or address."""
    if not url:
        return ""
    parts, refusal = _split(url)
    if refusal:
        return refusal
    name = parts.hostname.rstrip(".").lower()
    if name != host.name.lower() and not _allowed(name, settings.MOEOPS_ENDPOINT_ALLOWLIST):
        return (
            f"{parts.hostname} is neither host {host.name} nor in MOEOPS_ENDPOINT_ALLOWLIST "
            f"({', '.join(settings.MOEOPS_ENDPOINT_ALLOWLIST) or 'empty'})"
        )
    if parts.path.strip("/") or parts.query or parts.fragment:
        # the worker adds /v1/models, /health, /metrics to it: a path would be said twice
        return (
            f"the endpoint is the server's base URL, without /v1 or another path: "
            f"{parts.scheme}://{parts.netloc}"
        )
    return ""


def _split(url):
    """(urlsplit's parts, "") of an http(s) URL with a host that every client reads alike, or
    (None, why not).

    Userinfo, backslashes and control characters (a tab urlsplit drops) are refused: clients
    disagree on them (httpx reads http://169.254.169.254\\@127.0.0.1/ as 127.0.0.1, urllib3 and
    browsers as the metadata address), so the host checked would not be the host fetched."""
    if "\\" in url or any(ord(ch) < 32 or ord(ch) == 127 for ch in url):
        return None, "the URL holds a backslash or a control character: give none"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port out of range raises here
    except ValueError as exc:
        return None, f"{url!r} is not a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None, f"{url!r} is not an http(s) URL with a host"
    if "@" in parts.netloc:
        return None, "the URL holds a user name or password (before an @): give none"
    name = parts.hostname.rstrip(".").lower()
    if not _is_address(name) and not HOST_NAME.fullmatch(name):
        return None, f"{parts.hostname!r} is neither a host name nor an IP address"
    return parts, ""


def _is_address(name):
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _allowed(name, allowlist):
    """Whether a host name or IP address is in the allow-list: names (".lab.example" for every
    name under lab.example), addresses and networks (10.0.0.0/8)."""
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        address = None
    for entry in allowlist:
        entry = entry.lower()
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
        elif name == entry or (entry.startswith(".") and name.endswith(entry)):
            return True
    return False


def webhook_refusal(url):
    """Why moeops may not send an alert to the webhook `url`, or "" when it may: an http(s) URL
    whose host is in MOEOPS_WEBHOOK_ALLOWLIST (matched as the endpoints' list is)."""
    parts, refusal = _split(url)
    if refusal:
        return refusal
    name = parts.hostname.rstrip(".").lower()
    if not _allowed(name, settings.MOEOPS_WEBHOOK_ALLOWLIST):
        allowed = ", ".join(settings.MOEOPS_WEBHOOK_ALLOWLIST) or "empty"
        return f"{parts.hostname} is not in MOEOPS_WEBHOOK_ALLOWLIST ({allowed})"
    return ""


def _origin(url):
    try:
        parts = urlsplit(url)
        return parts.scheme, (parts.hostname or "").rstrip(".").lower(), parts.port
    except ValueError:
        return url


def endpoint_change_refusal(*, host, url, user, current=""):
    """Why `user` may not set a deployment of `host` from endpoint `current` to `url`, or "".

    A new address (scheme, host name or port) is for whom permissions.may_set_endpoint lets
    (staff, permissions.API_TOKEN; None is nobody). Whoever sets it, and whenever it is saved,
    the address must pass endpoint_refusal."""
    if not url or _origin(url) == _origin(current):
        return endpoint_refusal(host=host, url=url)
    if not permissions.may_set_endpoint(user):
        return "only staff may point a deployment at a new endpoint address"
    return endpoint_refusal(host=host, url=url)
