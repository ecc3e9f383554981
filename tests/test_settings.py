"""Unit: WorkerSettings is the one source of each default and bound; flags and QUEUEWORKER_*
variables are derived from it, flags win, and any bad value is one SettingsError naming its source."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings as hypothesis_settings, strategies as st
from pydantic import ValidationError

from queueworker.settings import SETTING_OPTIONS, SettingsError, WorkerSettings, settings_from

FLOAT_FIELDS = [name for name, field in WorkerSettings.model_fields.items()
                if "float" in str(field.annotation)]
INT_FIELDS = [name for name, field in WorkerSettings.model_fields.items() if "int" in str(field.annotation)]
OPTIONS = {option.field: option for option in SETTING_OPTIONS}


def test_unset_intervals_follow_the_lease_and_the_drain():
    settings = WorkerSettings(lease_seconds=10, drain_seconds=7)
    assert settings.heartbeat_seconds == pytest.approx(10 / 3)
    assert settings.rescue_interval_seconds == 2.5 and settings.worker_ttl_seconds == 40
    assert settings.shutdown_seconds == 12
    explicit = WorkerSettings(lease_seconds=10, heartbeat_seconds=5, shutdown_seconds=60)
    assert explicit.heartbeat_seconds == 5 and explicit.shutdown_seconds == 60


@pytest.mark.parametrize("field", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e308, "inf", "nan", "1e308"])
def test_every_duration_is_finite_and_fits_postgres_and_python_timers(field, value):
    with pytest.raises(ValidationError, match=field):
        WorkerSettings(**{field: value})


@pytest.mark.parametrize("field", INT_FIELDS)
def test_every_count_is_bounded(field):
    with pytest.raises(ValidationError, match=field):
        WorkerSettings(**{field: 10**30})


@pytest.mark.parametrize("options, message", [
    ({"heartbeat_seconds": 20}, "at most half the lease"),
    ({"poll_min_seconds": 5, "poll_max_seconds": 1}, "must not exceed"),
    ({"drain_seconds": 60, "shutdown_seconds": 30}, "the drain is part of the shutdown"),
    ({"queues": ()}, "at least 1 item"),
    ({"queues": ("ok\n",)}, "should match pattern"),
    ({"metrics_address": "not an address"}, "IP address or a host name"),
    ({"command_env": ("PATH", "BAD-NAME")}, "should match pattern"),
    ({"command_output_limit_bytes": 10}, "greater than or equal to 1024"),
])
def test_incoherent_settings_are_refused(options, message):
    with pytest.raises(ValidationError, match=message):
        WorkerSettings(**options)


def test_every_field_has_one_flag_and_one_variable_and_the_old_flag_names_stay():
    assert [option.field for option in SETTING_OPTIONS] == list(WorkerSettings.model_fields)
    flags = [option.flag for option in SETTING_OPTIONS]
    variables = [option.env for option in SETTING_OPTIONS]
    assert len(set(flags)) == len(flags) and len(set(variables)) == len(variables)
    assert all(variable.startswith("QUEUEWORKER_") for variable in variables)
    assert {"--queue", "--concurrency", "--lease-seconds", "--heartbeat-seconds", "--drain-seconds",
            "--task-timeout", "--retry-base-seconds", "--retention-hours", "--metrics-port", "--metrics-address",
            "--shutdown-seconds", "--unknown-task-grace-seconds", "--command-env",
            "--command-output-limit-bytes"} <= set(flags)
    assert {"QUEUEWORKER_CONCURRENCY", "QUEUEWORKER_QUEUES", "QUEUEWORKER_COMMAND_ENV"} <= set(variables)


def test_a_flag_wins_over_its_variable_and_a_variable_over_the_default():
    environ = {"QUEUEWORKER_CONCURRENCY": "7", "QUEUEWORKER_LEASE_SECONDS": "12",
               "QUEUEWORKER_QUEUES": " mail, sms ,,", "QUEUEWORKER_COMMAND_ENV": "HOME,AWS_REGION",
               "QUEUEWORKER_RETENTION_HOURS": "2", "QUEUEWORKER_DRAIN_SECONDS": ""}
    settings = settings_from({"concurrency": "3", "queues": None}, environ)
    assert settings.concurrency == 3
    assert settings.lease_seconds == 12 and settings.heartbeat_seconds == 4
    assert settings.queues == ("mail", "sms") and settings.command_env == ("HOME", "AWS_REGION")
    assert settings.retention_seconds == 2 * 3600
    assert settings.drain_seconds == WorkerSettings().drain_seconds, "an empty variable counts as unset"
    assert settings_from({"queues": ["a", "b"], "retention_seconds": "0.5"}, environ).queues == ("a", "b")
    assert settings_from({}, {}) == WorkerSettings()


@pytest.mark.parametrize("flags, environ, message", [
    ({}, {"QUEUEWORKER_CONCURRENCY": "many"}, "QUEUEWORKER_CONCURRENCY: Input should be a valid integer"),
    ({"concurrency": "0"}, {}, "--concurrency: Input should be greater than or equal to 1"),
    ({}, {"QUEUEWORKER_RETENTION_HOURS": "nan"}, "QUEUEWORKER_RETENTION_HOURS"),
    ({"retention_seconds": "1e308"}, {}, "--retention-hours"),
    ({"retention_seconds": "soon"}, {}, "--retention-hours: Input should be a valid number"),
    ({}, {"QUEUEWORKER_TASK_TIMEOUT": "inf"}, "QUEUEWORKER_TASK_TIMEOUT: Input should be a finite number"),
    ({}, {"QUEUEWORKER_QUEUES": "ok,not ok"}, "QUEUEWORKER_QUEUES: String should match pattern"),
    ({"lease_seconds": "nan"}, {"QUEUEWORKER_LEASE_SECONDS": "30"}, "--lease-seconds: Input should be a finite"),
])
def test_a_bad_value_is_one_line_naming_where_it_came_from(flags, environ, message):
    with pytest.raises(SettingsError) as info:
        settings_from(flags, environ)
    assert message in str(info.value) and "\n" not in str(info.value)


@hypothesis_settings(max_examples=300, deadline=None)
@given(field=st.sampled_from([option.field for option in SETTING_OPTIONS]),
       text=st.one_of(st.text(), st.floats().map(repr), st.integers().map(str)),
       from_environment=st.booleans())
def test_any_text_for_any_setting_is_a_setting_or_one_clear_error(field, text, from_environment):
    option = OPTIONS[field]
    flags, environ = ({}, {option.env: text}) if from_environment else (
        {field: [text] if option.is_list else text}, {})
    try:
        settings = settings_from(flags, environ)
    except SettingsError as exc:
        assert "\n" not in str(exc) and str(exc)
    else:
        for name in FLOAT_FIELDS:
            value = getattr(settings, name)
            assert value is None or math.isfinite(value)


# --- where a QueueWorker's spec becomes worker flags (the controller renders them) -------------------

CRD_SPEC = yaml.safe_load((Path(__file__).resolve().parent.parent / "crds" / "queueworker.dev_queueworkers.yaml")
                          .read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
# The spec fields that become `queueworker worker` flags, and the settings they set.
WORKER_FLAG_FIELDS = {"concurrency": "concurrency", "leaseSeconds": "lease_seconds", "drainSeconds": "drain_seconds",
                      "metricsPort": "metrics_port"}


def settings_of_the_pods(spec: dict) -> WorkerSettings:
    """The settings a QueueWorker's worker pods start with: its Deployment's args, parsed by the worker."""
    from queueworker.cli import build_parser
    from queueworker_controller.deployment import worker_args
    from queueworker_controller.spec import QueueWorkerSpec

    minimal = {"queue": "q", "image": "i", "database": {"secretRef": {"name": "s"}}}
    args = build_parser().parse_args(worker_args(QueueWorkerSpec.from_dict({**minimal, **spec})))
    return settings_from({option.field: getattr(args, option.field) for option in SETTING_OPTIONS}, {})


def test_a_queueworker_that_sets_nothing_runs_its_workers_with_the_worker_defaults():
    """The controller's defaults for these fields are WorkerSettings' (tests/test_crd.py holds the
    CRD's to the controller's); the metrics port alone differs: a QueueWorker's pods serve metrics."""
    defaults, pods = WorkerSettings(), settings_of_the_pods({})
    assert [getattr(pods, field) for field in WORKER_FLAG_FIELDS.values() if field != "metrics_port"] == \
        [getattr(defaults, field) for field in WORKER_FLAG_FIELDS.values() if field != "metrics_port"]
    assert pods.metrics_port == CRD_SPEC["properties"]["metricsPort"]["default"] and defaults.metrics_port is None


@pytest.mark.parametrize("bound", ["minimum", "maximum"])
def test_every_value_the_crd_accepts_for_a_worker_flag_the_worker_accepts(bound):
    """At the CRD's bounds of every field that becomes a worker flag, the pods' args are settings."""
    spec = {name: CRD_SPEC["properties"][name][bound] for name in WORKER_FLAG_FIELDS}
    pods = settings_of_the_pods(spec)
    assert all(getattr(pods, field) == (spec[name] or None if name == "metricsPort" else spec[name])
               for name, field in WORKER_FLAG_FIELDS.items())
