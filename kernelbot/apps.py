from django.contrib.admin.apps import AdminConfig


class KernelbotAdminConfig(AdminConfig):
    default_site = "kernelbot.admin.KernelbotAdminSite"
