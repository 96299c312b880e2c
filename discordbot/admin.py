from django.contrib import admin

from .models import Announcement, Guild, OrganiserRole, StatusMessage


class OrganiserRoleInline(admin.TabularInline):
    model = OrganiserRole
    extra = 1


@admin.register(Guild)
class GuildAdmin(admin.ModelAdmin):
    list_display = ("__str__", "guild_id", "enabled", "submission_channel_id", "announcement_channel_id",
                    "report_channel_id")
    inlines = [OrganiserRoleInline]


@admin.register(Announcement)
class AnnouncementAdmin(admin.ModelAdmin):
    list_display = ("key", "guild", "created", "message_id")
    readonly_fields = ("key", "guild", "text", "message_id", "created")


@admin.register(StatusMessage)
class StatusMessageAdmin(admin.ModelAdmin):
    list_display = ("submission", "user", "channel_id", "message_id", "finished", "created")
    exclude = ("interaction_token",)
    readonly_fields = ("submission", "user", "guild_id", "channel_id", "application_id", "token_expires",
                       "message_id", "finished")
