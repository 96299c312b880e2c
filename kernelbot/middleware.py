from django.http import JsonResponse


class RejectNulBytesMiddleware:
    """NUL bytes in a path or query can never name anything; answer 400 before any database sees them
    (PostgreSQL refuses them with an error, SQLite would silently miss)."""

    MESSAGE = "The request's path or query holds a NUL byte, which no name can contain."

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if "\x00" in request.path or any("\x00" in key or "\x00" in value
                                         for key, values in request.GET.lists() for value in values):
            return JsonResponse({"detail": self.MESSAGE}, status=400)
        return self.get_response(request)
