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


class JsonMethodNotAllowedMiddleware:
    """A method a route of the APIs (/api/..., /popcorn/...) does not take is a 405 in the APIs' error format,
    {"detail": ...}, with its Allow header, not the frameworks' bare text (django-ninja's "Method not allowed",
    Django's empty body for require_POST views)."""

    PREFIXES = ("/api/", "/popcorn/")

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if response.status_code != 405 or not request.path.startswith(self.PREFIXES) \
                or response.get("Content-Type", "").startswith("application/json"):
            return response
        allowed = response.get("Allow", "")
        answer = JsonResponse({"detail": f"{request.method} is not allowed on {request.path}; "
                                         f"it takes {allowed or 'no method'}."}, status=405)
        if allowed:
            answer["Allow"] = allowed
        return answer
