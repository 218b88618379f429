"""Request-body parsing and error responses: a 4xx whose message names the field, never a trace."""

import json
import logging
import sys

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, RequestDataTooBig
from django.core.exceptions import ValidationError as ModelValidationError
from django.http import Http404
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser

from domain.topology import TopologyParseError
from moeops.fleet.services import AlreadyExists
from moeops.insights.services import NoteConflict
from moeops.kernels.services import TuningConflict
from moeops.keyed import KeyConflict
from moeops.runs.importers import ResultFileError, ResultFileMismatch
from moeops.runs.services import RunConflict
from tuning.moe_params import MoEConfigError

log = logging.getLogger(__name__)


class BodyError(ValueError):
    """The body is not UTF-8 JSON; the message says where."""

    status = 400


class NotJson(BodyError):
    """The body is sent as something else than JSON (answered 415)."""

    status = 415


def _first_path(obj, bad, path="body"):
    """Path of the first value (or key) of a parsed body for which bad() holds, or None."""
    if bad(obj):
        return path
    if isinstance(obj, dict):
        for key, value in obj.items():
            if bad(key):
                return f"{path} (a key)"
            found = _first_path(value, bad, f"{path}.{key}")
            if found:
                return found
    if isinstance(obj, list):
        for i, value in enumerate(obj):
            found = _first_path(value, bad, f"{path}.{i}")
            if found:
                return found
    return None


def _nul_key(obj):
    """(where, key) of the first key of a parsed body holding a NUL character, or None.

    No field's name holds a NUL: the payload models would drop such a key as unknown, without
    a word. Iterative: a body may nest as deep as the JSON parser reads."""
    stack = [(obj, "body")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            for key in item:
                if "\x00" in key:
                    return where, key
            # reversed: the stack then yields them in the body's order
            stack.extend((item[key], f"{where}.{key}") for key in reversed(item))
        elif isinstance(item, list):
            stack.extend((item[i], f"{where}.{i}") for i in reversed(range(len(item))))
    return None


def _undecodable(value):
    # bytes that were not UTF-8, kept as lone surrogates by the surrogateescape decoding
    return isinstance(value, str) and any("\udc80" <= ch <= "\udcff" for ch in value)


# stands for an integer of the body with more digits than int() reads
_LONG_NUMBER = object()


def _long_number_error(body):
    """The BodyError naming the field of the first integer past Python's digit limit."""
    limit = sys.get_int_max_str_digits()
    data = json.loads(
        body, parse_int=lambda t: int(t) if len(t.lstrip("-")) <= limit else _LONG_NUMBER
    )
    where = _first_path(data, lambda value: value is _LONG_NUMBER) or "body"
    return BodyError(
        f"{where}: an integer of more than {limit:,} digits, more than numbers in a body may have"
    )


class StrictUtf8Parser(Parser):
    """JSON bodies must be UTF-8; a bad byte inside a string is reported by its field."""

    def parse_body(self, request):
        # a form or text body read as JSON anyway would be taken on a guess
        kind = request.content_type
        if kind != "application/json" and not kind.endswith("+json"):
            raise NotJson(
                f"Content-Type: {kind or 'none'} is not application/json; send the body as JSON"
            )
        raw = request.body
        try:
            body = raw.decode("utf-8")
            clean = True
        except UnicodeDecodeError:
            # Keep the bad bytes as lone surrogates so the field holding them can be named.
            body = raw.decode("utf-8", errors="surrogateescape")
            clean = False
        try:
            data = json.loads(body)
        except RecursionError:
            raise BodyError("request body is nested too deeply") from None
        except json.JSONDecodeError as exc:
            if not clean:
                raise BodyError("request body is not valid UTF-8") from None
            raise BodyError(
                f"request body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
            ) from None
        except ValueError:
            # int() refuses more digits than sys.get_int_max_str_digits (4,300), a guard against
            # quadratic-time conversion; found again with a parse that keeps such numbers aside
            raise _long_number_error(body) from None
        if not clean:
            where = _first_path(data, _undecodable) or "body"
            raise BodyError(f"{where}: not valid UTF-8")
        # JSON spells a NUL only as the escape \u0000 (a raw one is refused above): most bodies
        # skip the walk
        nul = _nul_key(data) if "\\u0000" in body else None
        if nul is not None:
            where, key = nul
            raise BodyError(
                f"{where}: the key {json.dumps(key)} holds a NUL character (\\u0000); no key may"
            )
        return data


def _field_name(loc):
    # ninja prefixes locations with the parameter source ("body", "query", "path") and name.
    parts = [str(p) for p in loc]
    if len(parts) >= 2 and parts[0] == "body":
        # a rule over the whole body (a model validator) is located at the payload itself
        parts = parts[2:]
    elif len(parts) > 1 and parts[0] in ("query", "path"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def validation_error(request, exc, api):
    """422 with ninja's `detail` list, plus one line naming the first bad field."""
    errors = [{key: err[key] for key in ("type", "loc", "msg") if key in err} for err in exc.errors]
    first = errors[0] if errors else {"loc": [], "msg": "invalid input"}
    # pydantic says "Value error, …" before a validator's own sentence: the sentence is enough
    said = str(first.get("msg")).removeprefix("Value error, ")
    message = f"{_field_name(first.get('loc', []))}: {said}"
    return api.create_response(request, {"detail": errors, "message": message}, status=422)


def http_error(request, exc, api):
    cause = exc.__cause__
    if isinstance(cause, BodyError):
        return api.create_response(request, {"detail": str(cause)}, status=cause.status)
    return api.create_response(request, {"detail": str(exc)}, status=exc.status_code)


def authentication_error(request, exc, api):
    response = api.create_response(
        request,
        {"detail": "authentication required: send Authorization: Bearer <token>"},
        status=401,
    )
    response["WWW-Authenticate"] = "Bearer"
    return response


def not_found(request, exc, api):
    return api.create_response(request, {"detail": str(exc) or "not found"}, status=404)


def too_big(request, exc, api):
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    detail = f"request body is larger than {limit} bytes (MOEOPS_MAX_BODY_BYTES)"
    if request.path.rstrip("/").endswith("/workloads"):
        # refused by its stated length, unread: the file's name inside it is not known
        size = int(request.META.get("CONTENT_LENGTH") or 0)
        detail = (
            f"the dataset file is refused unread: its request body of {size:,} bytes is larger "
            f"than {limit:,} bytes (MOEOPS_MAX_BODY_BYTES)"
        )
    return api.create_response(request, {"detail": detail}, status=413)


def conflict(request, exc, api):
    return api.create_response(request, {"detail": str(exc)}, status=409)


def bad_model_fields(request, exc, api):
    """A service's ValidationError: {field: [messages]} → one line per field."""
    if hasattr(exc, "message_dict"):
        # a rule over several fields (a model's clean) says which in its sentence
        lines = [
            "; ".join(msgs) if field == NON_FIELD_ERRORS else f"{field}: {'; '.join(msgs)}"
            for field, msgs in exc.message_dict.items()
        ]
    else:
        lines = exc.messages
    return api.create_response(request, {"detail": "; ".join(lines)}, status=400)


def bad_config(request, exc, api):
    return api.create_response(request, {"detail": f"config: {exc}"}, status=400)


def bad_topology(request, exc, api):
    # the parser names its source: "topology matrix" or "p2p read" (and write, nvlink, …)
    if exc.source.startswith("p2p "):
        field = f"nvidia_smi_p2p.{exc.source.removeprefix('p2p ')}"
    else:
        field = "nvidia_smi_topo"
    return api.create_response(request, {"detail": f"{field}: {exc}"}, status=400)


def bad_result_file(request, exc, api):
    body = {"detail": f"content: {exc}", "problems": exc.problems}
    return api.create_response(request, body, status=400)


def mismatched_result_file(request, exc, api):
    body = {
        "detail": f"content: {exc}; send accept_mismatch: true to import it all the same",
        "differences": exc.differences,
    }
    return api.create_response(request, body, status=409)


def server_error(request, exc, api):
    log.exception("API error on %s %s", request.method, request.path)
    return api.create_response(
        request, {"detail": "internal error; it has been logged"}, status=500
    )


def install(api):
    """Register the handlers on a NinjaAPI; the most specific class wins."""
    handlers = (
        (ValidationError, validation_error),
        (AuthenticationError, authentication_error),
        (HttpError, http_error),
        (Http404, not_found),
        (RequestDataTooBig, too_big),
        (AlreadyExists, conflict),
        (NoteConflict, conflict),
        (RunConflict, conflict),
        (KeyConflict, conflict),
        (TuningConflict, conflict),
        (ModelValidationError, bad_model_fields),
        (MoEConfigError, bad_config),
        (TopologyParseError, bad_topology),
        (ResultFileError, bad_result_file),
        (ResultFileMismatch, mismatched_result_file),
        (Exception, server_error),
    )
    for exc_class, handler in handlers:
        api.add_exception_handler(
            exc_class, lambda request, exc, handler=handler: handler(request, exc, api)
        )
