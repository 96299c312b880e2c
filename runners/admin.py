from django.contrib import admin

from .models import Gpu, GpuPool, GpuType, Node


@admin.register(GpuType)
class GpuTypeAdmin(admin.ModelAdmin):
    list_display = ["name", "vendor", "architecture"]
    search_fields = ["name"]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["__str__", "gpu_type", "node", "index", "enabled"]
    list_filter = ["gpu_type", "node__pool", "enabled"]


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 1


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["hostname", "pool", "enabled"]
    list_filter = ["pool", "enabled"]
    inlines = [GpuInline]


class NodeInline(admin.TabularInline):
    model = Node
    extra = 1
    show_change_link = True


@admin.register(GpuPool)
class GpuPoolAdmin(admin.ModelAdmin):
    list_display = ["name", "backend", "enabled", "memory_limit_mib", "device_count"]
    list_filter = ["backend", "enabled"]
    inlines = [NodeInline]

    @admin.display(description="devices")
    def device_count(self, pool: GpuPool) -> int:
        return Gpu.objects.filter(node__pool=pool).count()
