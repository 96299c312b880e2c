"""Every API error is {"detail": "<message>"}; the service layer's refusals keep their HTTP status."""

from __future__ import annotations

from django.db import DataError
from ninja import NinjaAPI

from leaderboards.access.actions import AccessDenied
from leaderboards.actions import SubmissionRejected


def install_error_handlers(api: NinjaAPI) -> None:
    @api.exception_handler(SubmissionRejected)
    def submission_rejected(request, exc: SubmissionRejected):
        response = api.create_response(request, {"detail": exc.message}, status=exc.status)
        if exc.retry_after:
            response["Retry-After"] = str(exc.retry_after)
        return response

    @api.exception_handler(AccessDenied)
    def access_denied(request, exc: AccessDenied):
        return api.create_response(request, {"detail": exc.message}, status=exc.status)

    @api.exception_handler(DataError)
    def data_error(request, exc: DataError):
        # e.g. a NUL byte in a name: the database refuses the value itself
        return api.create_response(request, {"detail": "The request holds characters that cannot be stored or "
                                             "looked up (such as NUL bytes)."}, status=400)
