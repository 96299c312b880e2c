from kernelbot.errors import AccessDenied, Refused

__all__ = ["AccessDenied", "Refused", "SubmissionRejected"]


class SubmissionRejected(Refused):
    """A submission that cannot be accepted."""
