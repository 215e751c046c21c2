"""One error shape for every non-2xx answer, so clients can show the field and the reason.

``{"error": "<code>", "message": "<what went wrong>", "errors": [{"field", "reason", "type"}]}``
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException


class FieldError(BaseModel):
    field: str = Field(description="path of the offending field, e.g. `[2].response_logprobs`; "
                       "empty for the whole body")
    reason: str
    type: str = Field(description="machine-readable kind: missing, int_type, extra_forbidden, ...")


class ErrorBody(BaseModel):
    error: str
    message: str
    errors: list[FieldError] = []


class ApiError(Exception):
    """Raised anywhere while handling a request; becomes an ``ErrorBody`` response."""

    def __init__(self, status: int, code: str, message: str, errors: Sequence[FieldError] = (),
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.errors = list(errors)
        self.headers = dict(headers or {})


def field_path(loc: Sequence[str | int]) -> str:
    """A pydantic location as a reader of the body writes it: ``(2, "response_logprobs")`` ->
    ``[2].response_logprobs``, ``("payload", "model")`` -> ``payload.model``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def field_errors(details: Sequence[Mapping[str, Any]], drop_prefix: Sequence[str] = ()) -> list[FieldError]:
    """Pydantic's error dicts as ``FieldError``s; ``drop_prefix`` strips FastAPI's ``("header", ...)``."""
    out = []
    for item in details:
        loc = list(item.get("loc", ()))
        if loc and loc[0] in drop_prefix:
            loc = loc[1:]
        reason, kind = str(item.get("msg", "")), str(item.get("type", ""))
        out.append(FieldError(field=field_path(loc), reason=reason, type=kind))
    return out


def error_response(error: ApiError) -> JSONResponse:
    body = ErrorBody(error=error.code, message=error.message, errors=error.errors)
    return JSONResponse(body.model_dump(), status_code=error.status, headers=error.headers)


_STATUS_CODES = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc)

    async def on_http_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = _STATUS_CODES.get(exc.status_code, f"http_{exc.status_code}")
        return error_response(ApiError(exc.status_code, code, str(exc.detail), headers=exc.headers))

    async def on_validation_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = field_errors(exc.errors(), drop_prefix=("header", "query", "path", "body"))
        return error_response(ApiError(422, "invalid_request", "the request does not validate", errors))

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
