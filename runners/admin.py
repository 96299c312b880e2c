"""GPU inventory admin: one page per pool with its backend settings, its devices (nodes created as needed by
hostname), its health and the checks that keep it honest, and each node's memory containment (whether runs there get
a memory cgroup, and how to fix it when they do not)."""

from __future__ import annotations

import json
import socket

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.checks import InlineModelAdminChecks
from django.core.exceptions import PermissionDenied
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Count, Prefetch, Q
from django.forms.models import BaseModelFormSet, modelformset_factory
from django.forms.utils import pretty_name
from django.http import HttpRequest, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_POST

from .actions import NodeRejected, check_local_devices, check_one_pool, claim_mismatch, probe_this_machine
from .models import CheckOutcome, Gpu, GpuPool, GpuType, Node, NodeService, PoolCheck, PoolHealth
from .pools import (
    MEMORY_FIX_DOC,
    BackendChoice,
    Contained,
    Containment,
    backend_choices,
    containment,
    env_state,
    secret_envs,
)
from .queue import enqueue_on_commit

HEALTH_MARK = {PoolHealth.OK: ("#2e7d32", "✔"), PoolHealth.FAILING: ("#c62828", "✖"), PoolHealth.UNKNOWN: ("#666", "–")}
CONTAINMENT_MARK = {Contained.CGROUP: ("#2e7d32", "✔"), Contained.PER_PROCESS: ("#b26a00", "⚠"),
                    Contained.REFUSED: ("#c62828", "✖"), Contained.UNKNOWN: ("#666", "–")}


def doc_link(doc: str) -> SafeString:
    """A docs/ reference ("docs/operations.md#section"): a link under KERNELBOT_DOCS_URL, else the path as code."""
    if settings.DOCS_URL:
        return format_html('<a href="{}/{}">{}</a>', settings.DOCS_URL, doc.removeprefix("docs/"), doc)
    return format_html("<code>{}</code>", doc)


def containment_html(node: Containment) -> SafeString:
    """One node's memory containment, marked, with the fix linked where there is one to make."""
    colour, mark = CONTAINMENT_MARK[node.state]
    text = mark_safe(escape(node.summary).replace(MEMORY_FIX_DOC, doc_link(MEMORY_FIX_DOC)))  # the path has no
    return format_html('<span style="color:{}">{}</span> {}', colour, mark, text)             # characters to escape


@admin.register(GpuType)
class GpuTypeAdmin(admin.ModelAdmin):
    list_display = ["name", "vendor", "architecture"]
    search_fields = ["name"]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["__str__", "gpu_type", "node", "index", "device_name", "checked_at", "enabled"]
    search_fields = ["node__hostname", "node__pool__name", "device_name", "uuid", "gpu_type__name"]
    list_filter = ["gpu_type", "node__pool", "enabled"]
    readonly_fields = ["uuid", "device_name", "memory_mib", "checked_at"]


def agent_html(node: Node) -> SafeString:
    if node.agent_live():
        agent = format_html('<span style="color:#2a7">✔ agent on {} (seen {} UTC)</span>', node.hostname,
                            f"{node.agent_seen_at:%H:%M:%S}")
    else:
        seen = f" (last seen {node.agent_seen_at:%Y-%m-%d %H:%M} UTC)" if node.agent_seen_at else ""
        agent = format_html('<span style="color:#c33">✘ no agent on {}{}: its devices get no run</span>', node.hostname,
                            seen)
    return format_html("{} {}", agent, service_html(node)) if node.state != NodeService.IN_SERVICE else agent


def service_html(node: Node) -> SafeString:
    """Its state as /metrics and the health API read it (`Node.state`)."""
    if node.state == NodeService.IN_SERVICE:
        return mark_safe('<span style="color:#2a7" data-state="in_service">✔ in service</span>')
    since = f" since {node.service_since:%Y-%m-%d %H:%M} UTC" if node.service_since and node.state == node.service \
        else ""
    return format_html('<span style="color:#c33" data-state="{}">✖ out of service{}: {}</span>', node.state, since,
                       node.state_detail)


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["hostname", "pool", "enabled", "devices", "agent_state", "service_state", "memory_containment",
                    "probed_at"]
    list_editable = ["enabled"]
    list_filter = ["pool", "enabled", "service"]
    search_fields = ["hostname"]
    readonly_fields = ["agent_state", "service_state", "agent", "memory_containment", "probed_at", "sandbox"]

    @admin.display(description="service", ordering="service")
    def service_state(self, node: Node) -> str:
        return service_html(node) if node.pool.is_local else "–"

    @admin.display(description="agent")
    def agent_state(self, node: Node) -> str:
        return agent_html(node) if node.pool.is_local else "–"

    def get_queryset(self, request: HttpRequest):
        return super().get_queryset(request).select_related("pool").annotate(device_count=Count("gpus"))

    @admin.display(description="devices")
    def devices(self, node: Node) -> int:
        return node.device_count

    @admin.display(description="memory containment")
    def memory_containment(self, node: Node) -> str:
        return containment_html(containment(node.hostname, node.sandbox))


# --- the pool page ---------------------------------------------------------------------------------------------
def settings_field(backend: str, name: str) -> str:
    return f"{backend}-{name}"


def configurable_backends(choices=None) -> list[BackendChoice]:
    """The usable backends that have settings."""
    return [c for c in (choices or backend_choices()) if c.unavailable is None and c.options is not None]


class GpuPoolForm(forms.ModelForm):
    """The pool's own fields, plus every usable backend's settings fields (`<backend>-<name>`); the chosen backend's
    are validated by its `options` form and stored in `settings`."""

    class Meta:
        model = GpuPool
        fields = ["name", "backend", "enabled", "memory_limit_mib", "disk_limit_mib", "cpus_per_device"]
        labels = {"backend": "Runs on"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.choices = {c.name: c for c in backend_choices()}
        current = self.instance.backend if self.instance.pk else None
        self.settings_fields: set[str] = set()
        self.fields["backend"].choices = [
            (c.name, c.label if c.unavailable is None else f"{c.label} (unavailable here: {c.unavailable})")
            for c in self.choices.values() if c.unavailable is None or c.name == current]
        self.fields["backend"].help_text = "Only the backends usable on this deployment are offered." + "".join(
            escape(f" {c.label}: {c.unavailable}.") for c in self.choices.values() if c.unavailable)
        for choice in configurable_backends(self.choices.values()):
            stored = self.instance.settings if choice.name == current else {}
            for name, field in choice.options().fields.items():
                field.required = False  # the backend's own form decides, and only when it is the chosen one
                field.label = field.label or pretty_name(name)  # "Partition" under Slurm, not "Slurm-partition"
                field.initial = stored.get(name, field.initial)
                if name.endswith("_env") and field.initial:
                    field.help_text += escape(f" ({field.initial} is {env_state(str(field.initial))} here.)")
                self.fields[settings_field(choice.name, name)] = field
                self.settings_fields.add(settings_field(choice.name, name))

    def clean(self):
        data = super().clean()
        for name in [n for n in self._errors if n in self.settings_fields]:
            del self._errors[name]  # only the chosen backend's own form judges its settings, once
        choice = self.choices.get(data.get("backend"))
        if choice is None or choice.options is None:
            self.settings = {}
            return data
        options = choice.options(data=self.data, files=self.files, prefix=choice.name)
        if not options.is_valid():
            for name, errors in options.errors.items():
                self.add_error(settings_field(choice.name, name) if name in options.fields else None, errors)
            return data
        given = {k: v for k, v in options.cleaned_data.items() if v not in (None, "", [], {})}  # empty: the default
        self.settings = json.loads(json.dumps(given, cls=DjangoJSONEncoder))
        return data

    def save(self, commit: bool = True) -> GpuPool:
        self.instance.settings = self.settings
        return super().save(commit)


class DeviceForm(forms.ModelForm):
    hostname = forms.CharField(label="machine", max_length=120, help_text="Its hostname; a new one adds the machine.")

    class Meta:
        model = Gpu
        fields = ["hostname", "index", "gpu_type", "enabled"]
        labels = {"index": "device #", "gpu_type": "GPU type"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.node_id:
            self.fields["hostname"].initial = self.instance.node.hostname


class DeviceFormSet(BaseModelFormSet):
    """Every device of a pool, each naming its machine; machines are created as needed and removed once empty. On a
    pool that runs on this machine, a claimed GPU type must match what this machine's probe finds."""

    def __init__(self, data=None, files=None, instance=None, save_as_new=False, prefix=None, queryset=None, **kw):
        self.instance = instance
        queryset = (Gpu.objects.filter(node__pool=instance).select_related("node", "gpu_type")
                    if instance is not None and instance.pk else Gpu.objects.none())
        super().__init__(data, files, prefix=prefix, queryset=queryset, **kw)

    @classmethod
    def get_default_prefix(cls) -> str:
        return "devices"

    def clean(self):
        super().clean()
        rows = [f for f in self.forms if f.has_changed() or f.instance.pk]
        rows = [f for f in rows if f.cleaned_data and not f.cleaned_data.get("DELETE")]
        seen: dict[tuple[str, int], forms.Form] = {}
        for form in rows:
            key = (form.cleaned_data.get("hostname", "").strip(), form.cleaned_data.get("index"))
            if key in seen:
                form.add_error("index", f"device #{key[1]} of {key[0]} is listed twice")
            seen[key] = form
        if self.instance is None or not self.instance.is_local:
            return
        for form in rows:  # a machine another local pool has already: its devices would get two pools' runs
            try:
                check_one_pool(self.instance, form.cleaned_data.get("hostname", "").strip())
            except NodeRejected as exc:
                form.add_error("hostname", f"Refused: {exc}.")
        # this machine's rows can be checked now; another machine's agent registers what it has when it starts (and
        # is refused in a second local pool), and until then its rows get no run
        here = {socket.gethostname(), "localhost"}
        claims = [f for f in rows if f.cleaned_data.get("enabled") and f.cleaned_data.get("gpu_type")
                  and not f.cleaned_data["gpu_type"].is_cpu and f.cleaned_data.get("hostname", "").strip() in here]
        if not claims:
            return
        try:
            report = probe_this_machine()
        except (NodeRejected, OSError, ValueError) as exc:
            raise forms.ValidationError(f"Could not check this machine's devices: {exc}") from exc
        for form in claims:
            if why := claim_mismatch(form.cleaned_data["gpu_type"], form.cleaned_data["index"], report):
                form.add_error("gpu_type", f"Refused: {why}. A pool that runs on this machine can only claim what "
                                           "this machine has; attach other machines through a remote backend.")

    def save_new(self, form, commit: bool = True):
        return self._save_device(form, commit)

    def save_existing(self, form, obj, commit: bool = True):
        return self._save_device(form, commit)

    def _save_device(self, form, commit: bool):
        hostname = form.cleaned_data["hostname"].strip()
        node = form.instance.node if form.instance.node_id and form.instance.node.hostname == hostname else None
        form.instance.node = node or Node.objects.get_or_create(pool=self.instance, hostname=hostname)[0]
        return form.save(commit=commit)

    def save(self, commit: bool = True):
        saved = super().save(commit)
        if commit:
            Node.objects.filter(pool=self.instance).annotate(n=Count("gpus")).filter(n=0).delete()
        return saved


class DeviceInlineChecks(InlineModelAdminChecks):
    """Devices belong to the pool through their machine, not by a foreign key of their own."""

    def _check_relation(self, obj, parent_model):
        return []

    def _check_exclude_of_parent_model(self, obj, parent_model):
        return []


class DeviceInline(admin.TabularInline):
    model = Gpu
    form = DeviceForm
    formset = DeviceFormSet
    checks_class = DeviceInlineChecks
    extra = 1
    verbose_name, verbose_name_plural = "device", "devices (one row per GPU; a CPU machine is one CPU row)"
    fields = ["hostname", "index", "gpu_type", "enabled", "device_name", "memory_mib", "checked_at"]
    readonly_fields = ["device_name", "memory_mib", "checked_at"]

    def get_formset(self, request, obj=None, **kwargs):
        return modelformset_factory(Gpu, form=self.form, formset=self.formset, fields=["hostname", "index",
                                    "gpu_type", "enabled"], extra=self.extra, can_delete=True,
                                    formfield_callback=lambda f, **kw: self.formfield_for_dbfield(f, request, **kw))


@admin.register(GpuPool)
class GpuPoolAdmin(admin.ModelAdmin):
    form = GpuPoolForm
    inlines = [DeviceInline]
    list_display = ["name", "backend_name", "enabled", "health_mark", "memory_mark", "last_ok_at", "gpu_types_served",
                    "runs_at_once", "history"]
    list_filter = ["backend", "enabled", "health"]
    search_fields = ["name", "nodes__hostname"]
    readonly_fields = ["health_mark", "health_detail", "agents", "memory_containment", "last_checked_at", "last_ok_at",
                       "history",
                       "gpu_types_served", "runs_at_once", "secrets"]
    actions = ["check_health", "check_devices"]
    change_form_template = "admin/runners/gpupool/change_form.html"

    def get_queryset(self, request: HttpRequest):
        enabled = Q(nodes__enabled=True, nodes__gpus__enabled=True)
        nodes = Prefetch("nodes", Node.objects.filter(enabled=True).order_by("hostname"), to_attr="enabled_nodes")
        return (super().get_queryset(request).annotate(device_count=Count("nodes__gpus", filter=enabled))
                .with_failing_since().prefetch_related(nodes))

    def get_fieldsets(self, request: HttpRequest, obj: GpuPool | None = None):
        fieldsets = [(None, {"fields": ["name", "backend", "enabled", "memory_limit_mib", "disk_limit_mib",
                                        "cpus_per_device"]})]
        for choice in configurable_backends():
            names = [settings_field(choice.name, n) for n in choice.options.base_fields]
            fieldsets.append((f"{choice.label} settings", {
                "fields": names, "classes": ["backend-settings", f"backend-{choice.name}"],
                "description": f"Used when the pool runs on {choice.label}. Secrets are never stored here: a field "
                               "ending in “env” names the environment variable that holds one."}))
        fieldsets.append(("Health and capacity", {"fields": ["health_mark", "health_detail", "agents",
                                                             "memory_containment",
                                                             "last_checked_at", "last_ok_at", "history",
                                                             "gpu_types_served", "runs_at_once", "secrets"]}))
        return fieldsets

    def get_form(self, request: HttpRequest, obj=None, change=False, **kwargs):
        kwargs["fields"] = None  # the form's own: the settings fields are added per backend, not model fields
        return super().get_form(request, obj, change, **kwargs)

    @admin.display(description="runs on", ordering="backend")
    def backend_name(self, pool: GpuPool) -> str:
        return pool.get_backend_display()

    @admin.display(description="health", ordering="health")
    def health_mark(self, pool: GpuPool) -> str:
        colour, mark = HEALTH_MARK[pool.health]
        failing = pool.health == PoolHealth.FAILING
        began = getattr(pool, "failing_since", None)  # get_queryset's: when the failure began, not the last check
        since = f" since {began:%Y-%m-%d %H:%M} UTC" if failing and began else ""
        out = [n.hostname for n in self.enabled(pool) if n.state != NodeService.IN_SERVICE] \
            if pool.pk and pool.is_local else []
        note = f" ({', '.join(out)} out of service)" if out and not failing else ""
        return format_html('<span style="color:{}" title="{}">{} {}{}{}</span>', colour,
                           pool.health_detail if failing else "", mark, pool.get_health_display(), since, note)

    def containments(self, pool: GpuPool) -> list[Containment]:
        nodes = getattr(pool, "enabled_nodes", None)
        if nodes is None:
            nodes = list(pool.nodes.filter(enabled=True).order_by("hostname")) if pool.pk else []
        return [containment(node.hostname, node.sandbox) for node in nodes]

    @admin.display(description="memory")
    def memory_mark(self, pool: GpuPool) -> str:
        """The worst of its nodes' containment: refused, per-process only, unknown, else contained."""
        found = self.containments(pool)
        for state, words in ((Contained.REFUSED, "refused on"), (Contained.PER_PROCESS, "per-process only on"),
                             (Contained.UNKNOWN, "not reported by")):
            if hit := [c for c in found if c.state == state]:
                colour, mark = CONTAINMENT_MARK[state]
                return format_html('<span style="color:{}" title="{}">{} {} {}</span>', colour,
                                   "; ".join(c.summary for c in hit), mark, words,
                                   ", ".join(c.hostname for c in hit))
        colour, mark = CONTAINMENT_MARK[Contained.CGROUP]
        return format_html('<span style="color:{}">{} cgroup</span>', colour, mark) if found else "–"

    @admin.display(description="node agents")
    def agents(self, pool: GpuPool) -> str:
        """A local pool's machines each run an agent; a node without a live one, or out of service, gets no run."""
        if not pool.pk or not pool.is_local:
            return "–"
        nodes = self.enabled(pool)
        if not nodes:
            return "no node yet: run `python -m runners.harness.node` on each machine (docs/operations.md)"
        return format_html("<ul>{}</ul>", format_html_join("", "<li>{}</li>", ((agent_html(n),) for n in nodes)))

    def enabled(self, pool: GpuPool) -> list[Node]:
        nodes = getattr(pool, "enabled_nodes", None)
        return nodes if nodes is not None else list(pool.nodes.filter(enabled=True).order_by("hostname"))

    @admin.display(description="memory containment (per node)")
    def memory_containment(self, pool: GpuPool) -> str:
        """Each enabled node: whether its runs get a memory cgroup, from its last probe, and the fix when not."""
        found = self.containments(pool)
        if not found:
            return "no node yet"
        return format_html("<ul>{}</ul>", format_html_join("", "<li>{}</li>", ((containment_html(c),)
                                                                                   for c in found)))

    @admin.display(description="health history")
    def history(self, pool: GpuPool) -> str:
        url = reverse("admin:runners_poolcheck_changelist") + f"?pool__id__exact={pool.pk}"
        return format_html('<a href="{}">checks</a>', url) if pool.pk else "–"

    @admin.display(description="GPU types served")
    def gpu_types_served(self, pool: GpuPool) -> str:
        if not pool.pk:
            return "–"
        names = GpuType.objects.filter(gpus__node__pool=pool, gpus__enabled=True, gpus__node__enabled=True)
        return ", ".join(sorted(set(names.values_list("name", flat=True)))) or "none"

    @admin.display(description="runs at once")
    def runs_at_once(self, pool: GpuPool) -> str:
        count = getattr(pool, "device_count", None)
        if count is None:
            count = Gpu.objects.filter(node__pool=pool, node__enabled=True, enabled=True).count() if pool.pk else 0
        return f"{count} (one per enabled device)"

    @admin.display(description="secrets (from the environment)")
    def secrets(self, pool: GpuPool) -> str:
        choice = next((c for c in backend_choices() if c.name == pool.backend), None)
        found = secret_envs(choice, pool.settings) if choice else []
        if not found:
            return "none needed"
        return format_html("<ul>{}</ul>", format_html_join(
            "", "<li>{}: <code>{}</code> is {}</li>", ((what, env, env_state(env)) for what, env in found)))

    # --- checks: list actions and the buttons on the pool's page ---------------------------------------------------
    @admin.action(description="Check health now (a tiny known run on each GPU type)")
    def check_health(self, request: HttpRequest, queryset) -> None:
        started, busy = [], []
        for pool in queryset:
            if pool.checks.filter(outcome=CheckOutcome.PENDING).exists():
                busy.append(pool.name)
            else:
                enqueue_on_commit("leaderboards.tasks.check_pool", pool.pk)  # leaderboards owns runs; runners
                started.append(pool.name)                                    # never imports it
        if started:
            self.message_user(request, f"Health check started for {', '.join(started)}; its outcome shows here and in "
                              "the pool's health history within a minute or two.", messages.SUCCESS)
        if busy:
            self.message_user(request, f"Already being checked: {', '.join(busy)}.", messages.WARNING)

    @admin.action(description="Check the devices of pools that run on this machine")
    def check_devices(self, request: HttpRequest, queryset) -> None:
        for pool in queryset:
            if not pool.is_local:
                self.message_user(request, f"{pool.name} runs on {pool.get_backend_display()}: its machines are "
                                  "checked by its health check, or register them with `manage.py register_node`.",
                                  messages.INFO)
                continue
            try:
                problems = check_local_devices(pool)
            except (NodeRejected, OSError, ValueError) as exc:
                self.message_user(request, f"{pool.name}: could not check this machine: {exc}", messages.ERROR)
                continue
            if problems:
                self.message_user(request, f"{pool.name}: {'; '.join(problems.values())}. Those devices are now "
                                  "disabled: fix or delete them.", messages.ERROR)
            else:
                self.message_user(request, f"{pool.name}: every enabled device is as claimed.", messages.SUCCESS)

    def get_urls(self):
        def one(action):
            @require_POST
            def view(request: HttpRequest, pk: int):
                if not self.has_change_permission(request):
                    raise PermissionDenied
                getattr(self, action)(request, GpuPool.objects.filter(pk=get_object_or_404(GpuPool, pk=pk).pk))
                return HttpResponseRedirect(reverse("admin:runners_gpupool_change", args=[pk]))
            return self.admin_site.admin_view(view)

        return [path("<int:pk>/check-health/", one("check_health"), name="runners_gpupool_check_health"),
                path("<int:pk>/check-devices/", one("check_devices"), name="runners_gpupool_check_devices"),
                *super().get_urls()]


@admin.register(PoolCheck)
class PoolCheckAdmin(admin.ModelAdmin):
    list_display = ["started_at", "pool", "what", "outcome", "finished_at", "detail", "run"]
    list_filter = ["pool", "outcome"]
    list_select_related = ["pool", "gpu_type", "node"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    @admin.display(description="checked")
    def what(self, check: PoolCheck) -> str:
        what = f"a {check.gpu_type} run" if check.gpu_type_id else "nodes" if check.run_id is None else "a run"
        if check.node_id:
            what = f"{what} on {check.node.hostname}" if check.run_id else f"node {check.node.hostname}"
        return what

    @admin.display(description="run")
    def run(self, check: PoolCheck) -> str:
        if check.run_id is None:
            return "–"
        return format_html('<a href="{}">run {}</a>', reverse("admin:leaderboards_run_change", args=[check.run_id]),
                           check.run_id)
