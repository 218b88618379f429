"""API tokens in the browser: the list for every member, and for staff the form that makes one
(its plaintext shown on that one answer, never again) and the button that revokes one."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from moeops import permissions
from moeops.api import services
from moeops.api.models import ApiToken
from moeops.front.forms.tokens import TokenForm


def _page(request, form, *, made=None, status=200):
    ctx = {
        "nav": "tokens",
        "tokens": ApiToken.objects.select_related("host").order_by("name", "created"),
        "form": form,
        "made": made,
    }
    return render(request, "front/tokens.html", ctx, status=status)


@login_required
def tokens(request):
    """GET: the tokens. POST (staff): make one, and show its plaintext in this answer only."""
    if request.method != "POST":
        return _page(request, TokenForm())
    if not permissions.may_manage_tokens(request.user):
        raise PermissionDenied("only staff make API tokens")
    form = TokenForm(request.POST)
    if not form.is_valid():
        return _page(request, form, status=400)
    try:
        token, plaintext = services.token_issue(**form.cleaned_data)
    except ValidationError as exc:
        form.add_error(None, exc)
        return _page(request, form, status=400)
    return _page(request, TokenForm(), made={"token": token, "plaintext": plaintext})


@login_required
@require_POST
def token_revoke(request, pk):
    if not permissions.may_manage_tokens(request.user):
        raise PermissionDenied("only staff revoke API tokens")
    token = get_object_or_404(ApiToken, pk=pk)
    services.token_revoke(token=token)
    messages.success(request, f"Token {token.name} ({token.prefix}…) revoked.")
    return redirect("api-tokens")
