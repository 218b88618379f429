"""Who may call the API: every route declares a scope in its `auth=`.

Bearer tokens (ApiToken) read; a token that is not read-only writes, within its scope; a
logged-in browser session only reads. Reads are the API's default (READ); each write route
names one of HostWrite, AnyWrite or PersonOnly, and tests/web/test_api_auth.py fails for a
write route that names none. A 401 says how to authenticate, a 403 says why in a sentence.
"""

from datetime import timedelta

from django.utils import timezone
from ninja.errors import HttpError
from ninja.security import HttpBearer, SessionAuth

from moeops import permissions
from moeops.api.models import ApiToken

NO_HOST = "data not owned by one host"
# last_used is for people auditing tokens; minute resolution spares a write per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def _touch(token):
    now = timezone.now()
    if token.last_used is None or now - token.last_used > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used=now)
        token.last_used = now


class ReadScope(HttpBearer):
    """Any token, read-only ones too."""

    openapi_description = "Any API token (reads)."

    def authenticate(self, request, token):
        row = ApiToken.lookup(token.strip())
        if row is None:
            return None
        self.check(row)
        _touch(row)
        return row

    def check(self, token):
        """Raise HttpError(403) when a valid token is outside the scope."""


class SessionRead(SessionAuth):
    """A logged-in browser session, for GET requests."""

    openapi_description = "A logged-in browser session (reads)."

    def authenticate(self, request, key):
        user = getattr(request, "user", None)
        return user if user is not None and user.is_authenticated else None


class WriteScope(ReadScope):
    """A token that is not read-only; a browser session gets 403. Subclasses narrow it."""

    def __call__(self, request):
        if not request.headers.get("Authorization"):
            user = getattr(request, "user", None)
            if user is not None and user.is_authenticated:
                raise HttpError(403, "browser sessions may only read; write with an API token")
        return super().__call__(request)

    def check(self, token):
        if not permissions.token_may_write(token):
            raise HttpError(403, f"token {token.name!r} is read-only")


class HostWrite(WriteScope):
    """A writing token; one bound to a host writes only that host's data.

    Which host's data a request writes is known only once the handler has found the object
    (a run's deployment's host, …), so the handler checks it in one line with require_host().
    """

    openapi_description = (
        "A writing API token; a token bound to a host writes only that host's data."
    )


class AnyWrite(WriteScope):
    """Any writing token, host-bound ones too: data that every host's worker may push."""

    openapi_description = "A writing API token, bound to a host or not."


class PersonOnly(WriteScope):
    """A writing token bound to no host: data of no single host, and people's decisions."""

    openapi_description = "A writing API token bound to no host (a person's, not a worker's)."

    def __init__(self, refusal=f"is bound to host {{host!r}} and may not write {NO_HOST}"):
        # what a host-bound token is told after "token '<name>' "; {host} is its host's name
        self.refusal = refusal
        super().__init__()

    def check(self, token):
        super().check(token)
        if not permissions.token_is_personal(token):
            refusal = self.refusal.format(host=token.host.name)
            raise HttpError(403, f"token {token.name!r} {refusal}")


READ = [ReadScope(), SessionRead()]


def require_host(request, host):
    """403 unless the HostWrite token may write data of `host` (None: data of no single host)."""
    token = request.auth
    if permissions.token_may_write_host(token, host):
        return
    target = f"host {host.name!r}" if host is not None else NO_HOST
    raise HttpError(
        403, f"token {token.name!r} is bound to host {token.host.name!r} and may not write {target}"
    )
