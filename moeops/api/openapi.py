"""The OpenAPI schema documents every answer a route gives, its errors too.

The error answers come from the exception handlers of moeops.api.errors, not from the routes'
`response=` maps, so each route would list only its 2xx answers. ErrorsDocumented adds, per
route, the errors that what the route takes can cause (a token: 401; a writing scope: 403; a
JSON body: 400, 413, 415, 422; …) with the body the handlers send; `may_answer` names what a
route answers besides (503 where it enqueues on the broker).
"""

from http import HTTPStatus

from ninja import NinjaAPI, Schema
from ninja.openapi.schema import BODY_CONTENT_TYPES, OpenAPISchema
from pydantic import Field

from moeops.api.auth import WriteScope

WRITES = {"POST", "PUT", "PATCH", "DELETE"}


class ErrorOut(Schema):
    """What every error answer holds: a sentence naming the field or the cause."""

    detail: str = Field(description="what is wrong, naming the field or the cause")
    problems: list[str] | None = Field(
        None, description="a result file's refused lines, one sentence each (400 of an import)"
    )
    differences: list[str] | None = Field(
        None,
        description="what a result file measured differently from the deployment: model, TP, … "
        "(409 of an import)",
    )


class FieldError(Schema):
    type: str
    loc: list[str | int] = Field(description="where: body, query or path, then the field")
    msg: str


class ValidationErrorOut(Schema):
    """A 422: every field that failed validation, and one line naming the first."""

    detail: list[FieldError]
    message: str = Field(description="the first bad field and what is wrong with it")


DESCRIPTIONS = {
    400: "Refused: the body is not UTF-8 JSON, or a value breaks a rule; `detail` names the field.",
    401: "No valid token: send `Authorization: Bearer <token>`.",
    403: "The token may not write this (read-only, bound to another host, or a browser session).",
    404: "What the path or a name in the request refers to is not stored.",
    409: "Conflicts with what is stored: an idempotency key or name already stored with "
    "another body, a write to a finished run, a result file of another model, …",
    413: "The body is larger than MOEOPS_MAX_BODY_BYTES.",
    415: "The body is not sent as `Content-Type: application/json`.",
    422: "A field fails validation: `message` names the first, `detail` lists each.",
    503: "The broker did not answer in time; `detail` says what was not sent.",
}


def may_answer(*statuses):
    """Decorator (below `@router.…`): the route answers these error statuses too."""

    def mark(view):
        # on the view, not the operation: ninja clones operations when it binds a router
        view.also_answers = {*getattr(view, "also_answers", ()), *statuses}
        return view

    return mark


def error_statuses(operation):
    """The error statuses the route can answer, from what it takes."""
    statuses = set(getattr(operation.view_func, "also_answers", ()))
    sources = {model.__ninja_param_source__ for model in operation.models}
    if operation.auth_callbacks:
        statuses.add(401)
        if any(isinstance(auth, WriteScope) for auth in operation.auth_callbacks):
            statuses.add(403)
    if sources & set(BODY_CONTENT_TYPES):
        # a body may name rows (a deployment, a model) that are not stored
        statuses |= {400, 404, 413, 422}
    if "body" in sources:
        statuses.add(415)
    if sources - set(BODY_CONTENT_TYPES):
        statuses.add(422)
    if "path" in sources:
        statuses.add(404)
    if WRITES & set(operation.methods):
        # a service's rule naming the field, and what the write meets in the stored rows
        statuses |= {400, 409}
    return statuses


class ErrorsDocumented(OpenAPISchema):
    def responses(self, operation):
        result = super().responses(operation)
        for status in sorted(error_statuses(operation) - set(result)):
            body = ValidationErrorOut if status == 422 else ErrorOut
            # wrapped as ninja wraps a route's own response models, so the body is a component
            wrapped = operation._create_response_model(body)
            schema = self._create_schema_from_model(wrapped, mode="serialization")[0]
            result[status] = {
                "description": DESCRIPTIONS.get(status, HTTPStatus(status).phrase),
                "content": {self.api.renderer.media_type: {"schema": schema}},
            }
            if status == 401:
                result[status]["headers"] = {
                    "WWW-Authenticate": {"schema": {"type": "string"}, "description": "Bearer"}
                }
        return result


class DocumentedAPI(NinjaAPI):
    """A NinjaAPI whose schema lists each route's error answers."""

    def get_openapi_schema(self, *, path_prefix=None, path_params=None):
        if path_prefix is None:
            path_prefix = self.get_root_path(path_params or {})
        return ErrorsDocumented(self, path_prefix)
