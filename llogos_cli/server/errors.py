"""Errors in OpenAI's shape: {"error": {"message", "type", "code", "param"}}, with the HTTP status."""

from fastapi.responses import JSONResponse

from llogos_cli.server.schemas import ErrorBody, ErrorResponse

# The "type" OpenAI's clients map each status to.
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 500: "server_error", 501: "not_supported_error",
          503: "unavailable_error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.headers = status, message, code, param, headers

    def body(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorBody(message=self.message, type=_TYPES.get(self.status, "invalid_request_error"),
                                             code=self.code, param=self.param))

    def response(self) -> JSONResponse:
        return JSONResponse(self.body().model_dump(), self.status, headers=self.headers)
