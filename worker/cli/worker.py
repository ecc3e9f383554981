"""`queueworker migrate` and `queueworker worker`: the schema, and a worker process (or a supervisor
of several). Each of the worker's settings is a flag and an environment variable, both derived
from WorkerSettings."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..logs import LEVELS, configure_logging, default_format
from ..settings import SETTING_OPTIONS, SettingOption, WorkerSettings
from .common import CliError, bounded_int, command, secrets

MAX_PROCESSES = 256
LOG_FORMATS = ("json", "text")


def add_migrate(sub: Any, common: argparse.ArgumentParser) -> None:
    command(sub, "migrate", parents=[common], help="create or upgrade the queueworker schema")


def cmd_migrate(args: argparse.Namespace) -> int:
    from ..db.migrate import latest_version, migrate

    applied = migrate(args.dsn)
    names = ", ".join(f"{m.version:03d}_{m.name}" for m in applied) or "nothing to apply"
    print(f"schema at version {latest_version()} ({names})")
    return 0


def add_worker(sub: Any, common: argparse.ArgumentParser) -> None:
    wrk = command(sub, "worker", parents=[common], help="run a worker process",
                  description="Run a worker process. Each setting is also read from the environment "
                              "variable shown ($QUEUEWORKER_...; lists comma-separated); a flag wins "
                              "over its variable.")
    wrk.add_argument("--handlers", action="append", default=[], help="module with @task handlers (repeatable)")
    wrk.add_argument("--command", action="append", default=[], dest="commands", metavar="NAME=COMMAND",
                     help="run COMMAND for tasks named NAME: payload on stdin, JSON result on stdout")
    wrk.add_argument("--django", metavar="SETTINGS_MODULE", default=None,
                     help="set Django up with this settings module and run its tasks (django.tasks with "
                          "queueworker.django.QueueWorkerBackend: docs/django.md)")
    wrk.add_argument("--migrate", action="store_true", help="apply pending migrations before starting")
    wrk.add_argument("--processes", type=bounded_int(1, MAX_PROCESSES), default=None, metavar="N",
                     help="run N worker processes under one supervisor, for a pod with N CPUs; with "
                          "--metrics-port P, process i serves metrics on P+i (default: 1; $QUEUEWORKER_PROCESSES)")
    wrk.add_argument("--log-level", type=str.lower, choices=LEVELS,
                     help="(default: info; $QUEUEWORKER_LOG_LEVEL)")
    wrk.add_argument("--log-format", choices=LOG_FORMATS,
                     help="(default: text on a terminal, json otherwise; $QUEUEWORKER_LOG_FORMAT)")
    settings = wrk.add_argument_group("settings")
    for option in SETTING_OPTIONS:
        if option.is_switch:
            settings.add_argument(option.flag, dest=option.field, action="store_const", const=option.switched_to,
                                  default=None, help=_setting_help(option))
        else:
            settings.add_argument(option.flag, dest=option.field, metavar=_metavar(option), default=None,
                                  action="append" if option.is_list else "store", help=_setting_help(option))


def _metavar(option: SettingOption) -> str:
    field = option.field
    if field.endswith("_seconds"):
        # A flag in another unit names it last: --retention-hours, --watermark-retention-days.
        return "SECONDS" if option.scale == 1.0 else option.flag.rsplit("-", 1)[-1].upper()
    for suffix in ("port", "address", "bytes"):
        if field.endswith(f"_{suffix}"):
            return suffix.upper()
    if option.is_list:
        return "QUEUE" if field == "queues" else "NAME"
    return "N"


def _setting_help(option: SettingOption) -> str:
    """The field's description, its default in the flag's unit, and its variable."""
    description = WorkerSettings.model_fields[option.field].description or ""
    default = option.default_text
    repeat = "; repeatable" if option.is_list else ""
    text = f"{description}{repeat} ({'default: ' + default + '; ' if default is not None else ''}${option.env})"
    return text.replace("%", "%%")


def _process_option(given: str | None, flag: str, env: str, choices: tuple[str, ...], default: str) -> str:
    """A flag, else its environment variable, else the default; checked against `choices`."""
    value, source = (given, flag) if given is not None else (os.environ.get(env, "").strip().lower(), env)
    if not value:
        return default
    if value not in choices:
        raise CliError(f"{source}: must be one of {', '.join(choices)}")
    return value


def cmd_worker(args: argparse.Namespace) -> int:
    from ..runtime.external import register_commands
    from ..runtime.handlers import default_registry
    from ..runtime.worker import run_worker
    from ..settings import settings_from

    level = _process_option(args.log_level, "--log-level", "QUEUEWORKER_LOG_LEVEL", LEVELS, "info")
    log_format = _process_option(args.log_format, "--log-format", "QUEUEWORKER_LOG_FORMAT", LOG_FORMATS,
                                 default_format())
    settings = settings_from({option.field: getattr(args, option.field) for option in SETTING_OPTIONS}, os.environ)
    processes = args.processes if args.processes is not None else _processes_from_environment()
    if processes > 1:
        from ..runtime.processes import metrics_ports, run_processes

        try:
            ports = metrics_ports(settings.metrics_port, processes)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        configure_logging(level, log_format == "json", secrets(args.dsn))
        return run_processes(args.argv, ports)
    configure_logging(level, log_format == "json", secrets(args.dsn))
    _import_from_working_directory()
    try:
        if args.django is not None:
            _set_django_up(args.django, default_registry)
        default_registry.import_modules(args.handlers)
        register_commands(default_registry, args.commands, settings)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if settings.metrics_port is not None:
        from prometheus_client import start_http_server

        try:
            start_http_server(settings.metrics_port, addr=settings.metrics_address)
        except OSError as exc:
            raise CliError(f"cannot serve metrics on {settings.metrics_address} port {settings.metrics_port}: "
                           f"{exc.strerror or exc}") from None
    # Threads of sync handlers that ignored cancellation are daemons: they cannot hold up the exit.
    return run_worker(args.dsn, settings, default_registry, auto_migrate=args.migrate, install_signal_handlers=True)


def _set_django_up(settings_module: str, registry: Any) -> None:
    """`--django SETTINGS_MODULE`: django.setup() with that module, and the handler of Django's tasks."""
    os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    try:
        import django
        from django.core.exceptions import ImproperlyConfigured
    except ImportError:
        raise CliError("--django needs Django: pip install 'queueworker[django]'") from None
    try:
        django.setup()
        from ..django import register_django_tasks
    except (ImportError, ImproperlyConfigured) as exc:
        raise CliError(f"--django {settings_module}: {exc}") from None
    register_django_tasks(registry)


def _processes_from_environment() -> int:
    text = os.environ.get("QUEUEWORKER_PROCESSES", "").strip()
    if not text:
        return 1
    try:
        return bounded_int(1, MAX_PROCESSES)(text)
    except argparse.ArgumentTypeError as exc:
        raise CliError(f"QUEUEWORKER_PROCESSES: {exc}") from None


def _import_from_working_directory() -> None:
    """`--handlers app.tasks` finds `app` in the working directory, as `python -m` would: the
    script's own directory (the virtualenv's bin/) is what the interpreter put on the path."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
