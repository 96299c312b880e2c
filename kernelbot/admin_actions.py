"""Admin verbs on a single object's page (requeue this run, rescore this leaderboard) and list actions that ask
first: both go through one confirmation page (Django's intermediate-page pattern, like "delete selected"), so an
organiser never changes results with one stray click."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse


@dataclass(frozen=True)
class ObjectAction:
    name: str  # URL segment: /admin/<app>/<model>/<pk>/do/<name>/
    label: str  # the button
    question: str  # the confirmation page's question; {obj} is the object
    consequence: str  # what happens, said before it happens
    perform: Callable[[Any], str]  # does it; returns the message shown afterwards
    shown: Callable[[Any], bool] = lambda obj: True  # offered for this object at all (e.g. cancel: only while active)
    with_user: bool = False  # perform(obj, user): the organiser who asked is recorded


def confirm_page(model_admin: admin.ModelAdmin, request: HttpRequest, *, label: str, question: str,
                 consequence: str, objects: Iterable[Model], action: str | None = None) -> TemplateResponse:
    """The confirmation page: POSTs back to the object's action URL, or (`action` set) re-submits the list action
    with the selection and `confirmed=yes`."""
    opts = model_admin.model._meta
    objects = list(objects)
    return TemplateResponse(request, "admin/kb_confirm.html", {
        **model_admin.admin_site.each_context(request), "opts": opts, "title": question, "label": label,
        "consequence": consequence, "objects": objects, "action": action, "checkbox_name": ACTION_CHECKBOX_NAME,
        "links": [(obj, _change_url(obj)) for obj in objects]})


def confirmed_list_action(label: str, question: str, consequence: str, perform: Callable[[QuerySet], str]):
    """A list action that shows the confirmation page first and acts only on its "Yes" (confirmed=yes)."""
    def action(model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        if request.POST.get("confirmed") != "yes":
            name = request.POST.get("action", "")
            return confirm_page(model_admin, request, label=label, question=question, consequence=consequence,
                                objects=queryset, action=name)
        model_admin.message_user(request, perform(queryset), messages.SUCCESS)
        return None
    return action


def _change_url(obj: Model) -> str:
    opts = obj._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])


class ObjectActionsMixin:
    """Adds `object_actions` as buttons on the change page, each behind its confirmation page."""

    object_actions: tuple[ObjectAction, ...] = ()
    change_form_template = "admin/kb_change_form.html"

    def get_urls(self):
        opts = self.model._meta
        return [path("<path:object_id>/do/<slug:action>/", self.admin_site.admin_view(self.object_action_view),
                     name=f"{opts.app_label}_{opts.model_name}_do"), *super().get_urls()]

    def object_action_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        chosen = next((a for a in self.object_actions if a.name == action), None)
        obj = self.get_object(request, unquote(object_id))
        if chosen is None or obj is None:
            raise Http404(f"No {action!r} action for {self.model._meta.verbose_name} {object_id!r}.")
        if not self.has_change_permission(request, obj):
            raise PermissionDenied
        if not chosen.shown(obj):
            self.message_user(request, f"{chosen.label}: not possible for {obj} now.", messages.WARNING)
            return HttpResponseRedirect(_change_url(obj))
        if request.method == "POST":
            done = chosen.perform(obj, request.user) if chosen.with_user else chosen.perform(obj)
            self.message_user(request, done, messages.SUCCESS)
            return HttpResponseRedirect(_change_url(obj))
        return confirm_page(self, request, label=chosen.label, question=chosen.question.format(obj=obj),
                            consequence=chosen.consequence, objects=[obj])

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "", extra_context=None):
        obj = self.get_object(request, unquote(object_id))
        opts = self.model._meta
        buttons = [(a.label, reverse(f"admin:{opts.app_label}_{opts.model_name}_do", args=[obj.pk, a.name]))
                   for a in self.object_actions if obj is not None and a.shown(obj)]
        return super().change_view(request, object_id, form_url, {"object_buttons": buttons, **(extra_context or {})})
