"""Who may do what: one predicate for each decision, each refusing whoever it does not know.

A change is asked for by a person (a User, request.user on the pages), by an API token
(API_TOKEN: its scope was checked where its route is declared, moeops.api.auth, with the token
predicates below) or by moeops itself (MOEOPS: a watch that regressed, a finished tune, a
command). None is nobody: every predicate refuses it, so a caller that forgets to say who asks
is refused, never let through.
"""

from django.contrib.auth.decorators import user_passes_test
from django.core.exceptions import PermissionDenied


class Caller:
    """Who asks when no person does; services record no author for it."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"<{self.name}>"


API_TOKEN = Caller("an API token")
MOEOPS = Caller("moeops")


def person(who):
    """The User behind `who`, to record as author, or None (a token, moeops, nobody)."""
    return None if who is None or isinstance(who, Caller) else who


# --------------------------------------------------------------------------- people


def is_member(user) -> bool:
    """A signed-in, active user (None, a Caller and an anonymous user are not)."""
    return bool(getattr(user, "is_authenticated", False) and user.is_active)


def is_staff(user) -> bool:
    """A signed-in, active staff member (None, a Caller and an anonymous user are not)."""
    return is_member(user) and user.is_staff


# the pages only staff open; others go to the admin's sign-in, as Django's staff_member_required
staff_required = user_passes_test(is_staff, login_url="admin:login")


def may_change_engine(who) -> bool:
    """Whether `who` may change how a managed engine starts (a launch recipe, an engine action,
    a bisection's tries, a tune's config applied): staff, a writing API token, or moeops itself
    carrying out what staff or a token started (a watch, a plan item's tune)."""
    return who is API_TOKEN or who is MOEOPS or is_staff(who)


def require_engine_change(who):
    # who changes how an engine starts is on record, and only staff may
    if not may_change_engine(who):
        raise PermissionDenied("only staff may change how a managed engine starts")


def may_tune_for_plan_item(who, deployment) -> bool:
    """Whether `who` may start the re-tune a plan item of `deployment` asks for: on a managed
    deployment the tuned config is applied and the engine restarted (may_change_engine); on an
    external one the tune only runs on the host, which any signed-in member may start."""
    if deployment.is_managed:
        return may_change_engine(who)
    return isinstance(who, Caller) or is_member(who)


def require_tune_for_plan_item(who, deployment):
    if not may_tune_for_plan_item(who, deployment):
        if deployment.is_managed:
            raise PermissionDenied("only staff may change how a managed engine starts")
        raise PermissionDenied("only a signed-in member may start a tune")


def may_set_endpoint(who) -> bool:
    """Whether `who` may point a deployment at a new endpoint address (the web tier will send
    requests there): staff, or an API token, which an admin issued."""
    return who is API_TOKEN or is_staff(who)


def may_manage_tokens(user) -> bool:
    """Whether `user` may make or revoke API tokens: staff only."""
    return is_staff(user)


# --------------------------------------------------------------------------- API tokens


def token_may_write(token) -> bool:
    """Whether an ApiToken writes at all (a read-only one only reads)."""
    return token is not None and not token.read_only


def token_is_personal(token) -> bool:
    """Whether an ApiToken is a person's (bound to no host), not a worker's."""
    return token is not None and token.host_id is None


def token_may_write_host(token, host) -> bool:
    """Whether an ApiToken may write data of `host` (None: data of no single host): a writing
    token bound to no host writes any; one bound to a host writes only that host's."""
    if not token_may_write(token):
        return False
    return token_is_personal(token) or (host is not None and host.pk == token.host_id)
