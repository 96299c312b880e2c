class SubmissionRejected(Exception):
    """A submission that cannot be accepted; `status` is the HTTP status a front-end should answer."""

    def __init__(self, message: str, status: int = 400, retry_after: int | None = None):
        super().__init__(message)
        self.message, self.status, self.retry_after = message, status, retry_after
