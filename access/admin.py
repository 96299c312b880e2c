from django.contrib import admin

from .models import ApiToken, Ban, Invite, JobSwitch, Membership, PendingLogin, SubmissionQuota


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["user", "name", "hint", "created", "expires", "last_used", "revoked"]
    search_fields = ["user__username", "name", "hint"]
    readonly_fields = ["digest", "hint", "created", "last_used"]


@admin.register(PendingLogin)
class PendingLoginAdmin(admin.ModelAdmin):
    list_display = ["provider", "created", "token"]
    readonly_fields = ["digest"]


@admin.register(SubmissionQuota)
class SubmissionQuotaAdmin(admin.ModelAdmin):
    list_display = ["leaderboard", "kind", "max_submissions", "window_seconds"]
    list_filter = ["kind"]


@admin.register(Invite)
class InviteAdmin(admin.ModelAdmin):
    list_display = ["code", "leaderboard", "uses", "max_uses", "expires", "created"]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["leaderboard", "user", "joined"]
    search_fields = ["user__username"]


@admin.register(Ban)
class BanAdmin(admin.ModelAdmin):
    list_display = ["user", "leaderboard", "reason", "created"]
    search_fields = ["user__username"]


@admin.register(JobSwitch)
class JobSwitchAdmin(admin.ModelAdmin):
    list_display = ["accepting", "reason", "changed"]
