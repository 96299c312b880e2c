import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kernelbot.settings")
django.setup(set_prefix=False)

from kernelbot.handlers import SyncWorkerASGIHandler  # noqa: E402

django_asgi_app = SyncWorkerASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402 - needs the app registry loaded
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from leaderboards.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({
    "http": django_asgi_app,
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
})
