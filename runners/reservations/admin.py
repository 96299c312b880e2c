from django.contrib import admin

from .models import DeviceHold, PoolPolicy, Reservation, ReservationEvent, SshKey


@admin.register(PoolPolicy)
class PoolPolicyAdmin(admin.ModelAdmin):
    list_display = ["pool", "reservable", "max_gpus_per_user", "max_gpu_hours_per_user", "competition_share",
                    "max_duration_minutes"]


class EventInline(admin.TabularInline):
    model = ReservationEvent
    extra = 0
    readonly_fields = ["kind", "message", "created"]
    can_delete = False


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    list_display = ["pk", "user", "project", "pool", "gpu_type", "gpu_count", "minutes", "status", "started_at",
                    "ends_at"]
    list_filter = ["status", "pool", "gpu_type"]
    search_fields = ["user__username", "project"]
    readonly_fields = ["status", "status_deadline", "started_at", "ends_at", "finished_at", "node", "planned_start",
                       "planned_gpus", "access", "failure"]
    inlines = [EventInline]

    def has_add_permission(self, request) -> bool:
        return False  # through the reserve action only, so policy and the allocator apply


@admin.register(DeviceHold)
class DeviceHoldAdmin(admin.ModelAdmin):
    list_display = ["gpu", "kind", "project", "user", "started", "ends", "ended"]
    list_filter = ["kind", "pool", "gpu_type"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(SshKey)
class SshKeyAdmin(admin.ModelAdmin):
    list_display = ["user", "title", "fingerprint", "source", "github_login", "created"]
    list_filter = ["source"]
    search_fields = ["user__username", "fingerprint", "github_login"]

    def has_add_permission(self, request) -> bool:
        return False  # through keys.do_add_key only, so every key is checked at the door

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # view and delete
