"""Backends with settings, for the pool admin's tests (no service behind them: they only refuse dispatches)."""

from typing import ClassVar

from django import forms

from runners.backends.base import BackendUnavailable, Dispatch, PoolOptions, Reporter, RunnerBackend


class ClusterOptions(PoolOptions):
    partition = forms.CharField(help_text="The Slurm partition runs go to.")
    time_limit_min = forms.IntegerField(min_value=1, max_value=10080, initial=60, help_text="Minutes per job.")
    key_env = forms.CharField(label="SSH key", initial="FAKE_CLUSTER_KEY",
                              help_text="Environment variable holding the login node's SSH key.")


class ClusterBackend(RunnerBackend):
    remote = True
    options = ClusterOptions
    refuse: ClassVar[str] = ""  # set: dispatch raises BackendUnavailable with it (a service refusing our settings)

    def dispatch(self, job: Dispatch, reporter: Reporter) -> str:
        if self.refuse:
            raise BackendUnavailable(self.refuse)
        raise NotImplementedError("the admin tests never dispatch")


class MissingClientBackend(ClusterBackend):
    @classmethod
    def available(cls) -> str | None:
        return "the service's client library is not installed"
