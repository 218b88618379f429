"""Who may call the API: Bearer tokens (ApiToken) read and write; browser sessions only read."""

from datetime import timedelta

from django.utils import timezone
from ninja.errors import HttpError
from ninja.security import HttpBearer, SessionAuth

from moeops.api.models import ApiToken

# last_used is for people auditing tokens; minute resolution spares a write per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def _touch(token):
    now = timezone.now()
    if token.last_used is None or now - token.last_used > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used=now)
        token.last_used = now


class TokenAuth(HttpBearer):
    """`Authorization: Bearer moe_…`; with write=True a read-only token or a session gets 403."""

    def __init__(self, write):
        self.write = write
        super().__init__()

    def __call__(self, request):
        if not request.headers.get("Authorization") and self.write:
            user = getattr(request, "user", None)
            if user is not None and user.is_authenticated:
                raise HttpError(403, "browser sessions may only read; write with an API token")
        return super().__call__(request)

    def authenticate(self, request, token):
        row = ApiToken.lookup(token.strip())
        if row is None:
            return None
        if self.write and row.read_only:
            raise HttpError(403, f"token {row.name!r} is read-only")
        _touch(row)
        return row


class SessionReadAuth(SessionAuth):
    """A logged-in browser session, for GET requests."""

    def authenticate(self, request, key):
        user = getattr(request, "user", None)
        return user if user is not None and user.is_authenticated else None


READ = [TokenAuth(write=False), SessionReadAuth()]
WRITE = [TokenAuth(write=True)]


def require_write(request, host=None):
    """403 unless the caller's token may write data of `host` (None: data of no single host)."""
    token = request.auth
    if token.may_write_host(host):
        return
    if token.host_id is None:
        raise HttpError(403, f"token {token.name!r} is read-only")
    target = f"host {host.name!r}" if host is not None else "data not owned by one host"
    raise HttpError(
        403, f"token {token.name!r} is bound to host {token.host.name!r} and may not write {target}"
    )
